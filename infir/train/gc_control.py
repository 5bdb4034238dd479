"""Python's cyclic garbage collector, paced by the training loop (Megatron-LM's --manual-gc).

Why: left automatic, a collection starts wherever an allocation count crosses a threshold, often
inside a step while the host should be issuing kernels; a full one walks every object torch,
megatron and dynamo hold. Where the host is only just ahead of the GPU (a small model's step), the
GPU waits meanwhile. Under `StepGC(n)` the automatic collector is off, everything alive at entry is
frozen (out of later collections' walk), and `after_step` collects every n steps, at a step boundary.
The training loop's garbage is mostly freed by reference counting; cycles wait at most n steps.
"""
from __future__ import annotations

import gc
import time


class StepGC:
    """interval None: Python's automatic collector, untouched. interval n >= 1: inside the `with`
    block the collector is off and `after_step(step)` collects when step % n == 0. The previous
    state comes back on exit, also on an exception."""

    def __init__(self, interval: int | None):
        if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 1):
            raise ValueError(f"gc interval must be null or an integer >= 1, got {interval!r}")
        self.interval = interval
        self.collections = 0
        self.seconds = 0.0  # time spent in after_step's collections
        self._was_enabled = None

    def __enter__(self) -> "StepGC":
        if self.interval is not None:
            self._was_enabled = gc.isenabled()
            gc.collect()
            gc.freeze()
            gc.disable()
        return self

    def __exit__(self, *exc) -> None:
        if self.interval is not None:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()

    def after_step(self, step: int) -> None:
        if self.interval is not None and step % self.interval == 0:
            t0 = time.perf_counter()
            gc.collect()
            self.seconds += time.perf_counter() - t0
            self.collections += 1
