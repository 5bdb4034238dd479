"""Launching a compiled Triton kernel without Triton's per-call Python machinery.

`kernel[grid](*args)` re-binds arguments, computes the specialization key and looks up the cache on
every call: host time that dominated our small-kernel paths (the FP8 quantizers per linear, the
optimizer's one launch per parameter; bench/quant.py --host times it). `Launch` goes through that
path once, then calls the compiled kernel's launcher directly. Shared by infir.fp8.kernels and
infir.optim, whose kernels it launches.
"""
from __future__ import annotations

import torch
import triton

try:
    from triton import knobs as _knobs

    _RUNTIME = _knobs.runtime
except Exception:  # older Triton: no knobs, no direct launch
    _RUNTIME = None
_TRITON_VERSION = tuple(int(v) for v in triton.__version__.split(".")[:2] if v.isdigit())
# CompiledKernel.run(gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook,
# exit_hook, *all bound args, constexprs included) is what JITFunction.run calls in Triton 3.6-3.9
# (read in their sources); elsewhere every launch goes through JITFunction.run, and so does every launch
# in the interpreter, whose kernels return no compiled kernel to keep.
DIRECT = _RUNTIME is not None and _TRITON_VERSION >= (3, 6)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class Launch:
    """One kernel at one grid and configuration. The first call compiles through Triton's JIT
    (which also checks the arguments); later calls go straight to the compiled launcher.
    Callers key instances on everything Triton specializes on (integer values, 16-byte alignment
    of pointers, dtypes, constexprs), so the compiled kernel stays the right one."""

    __slots__ = ("kernel", "grid", "num_warps", "options", "run", "function", "meta")

    def __init__(self, kernel, grid, num_warps, **options):
        self.kernel, self.grid, self.num_warps, self.options = kernel, grid, num_warps, options
        self.run = None

    def __call__(self, device_index, *args):
        run = self.run
        hook = _RUNTIME.launch_enter_hook if run is not None else 0
        # Triton 3.6+: an empty HookChain (no profiler hooks registered) -> launch without hooks
        if run is not None and (hook is None or not getattr(hook, "calls", True)):
            g = self.grid
            run(g[0], g[1], g[2], _raw_stream(device_index), self.function, self.meta, None, None, None, *args)
            return
        k = self.kernel[self.grid](*args, num_warps=self.num_warps, **self.options)
        if DIRECT and _raw_stream is not None and k is not None and hasattr(k, "packed_metadata"):
            self.run, self.function, self.meta = k.run, k.function, k.packed_metadata


def grid1d(n: int) -> tuple[int, int, int]:
    return (n, 1, 1)
