"""Optimizer states in pinned host memory, stepped on the GPU (the talk's scheme, shared/seeds/004
slides 19-25; LLMQ §3.1 offloading).

For each parameter: copy its states host -> GPU on an H2D stream, run the update on an optimizer
stream once both the states and the gradient are there, and copy the states back on a D2H stream.
The GPU copies live only while in flight, so the GPU holds the weights, the gradients and a few
parameters' states instead of all states. Three streams let the H2D of one parameter, the update
of the next and the D2H of a third run at once, and, driven from backward hooks (release.py),
alongside the rest of backward on the default stream.

Only the optimizer's state tensors move; the parameter and its gradient stay on the GPU. With
SRAdamW that is 4 bytes per parameter each way per step; with FlashAdamW, ~3.1.

A parameter's states are packed into one pinned buffer (``to_host_packed``; the state dict
holds views into it), so each step moves them with one H2D and one D2H copy instead of one per
state tensor (five for FlashAdamW). Inside backward every host-side call of a hook delays the
launches of the rest of backward, so fewer copies, allocations and ``record_stream`` calls per
parameter matter most there.
"""
from collections import deque
from typing import Callable

import torch

from infir.optim.packing import packed, packed_buffer


class StateOffloader:
    def __init__(self, max_inflight_bytes: int = 4 << 30):
        # back-pressure: states copied to the GPU but not yet written back are capped, or a
        # fast backward would pull every state onto the GPU and undo the offload. The cap blocks
        # the host thread, which inside backward also stalls kernel launches: keep it well
        # above one layer's states
        self.max_inflight_bytes = max_inflight_bytes
        self._streams: dict[torch.device, tuple] = {}
        self._inflight: deque = deque()  # (event after write-back, bytes)
        self._inflight_bytes = 0
        self._writeback_of: dict[int, torch.cuda.Event] = {}  # host tensor -> its last D2H

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_cuda:
            return t.to("cpu").pin_memory()
        return t.pin_memory() if torch.cuda.is_available() and not t.is_pinned() else t

    @staticmethod
    def to_host_packed(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copies of ``tensors`` as views into one (pinned, where CUDA exists) host buffer."""
        return packed(tensors, "cpu", pin=torch.cuda.is_available())

    def _streams_for(self, device: torch.device) -> tuple:
        if device not in self._streams:
            self._streams[device] = tuple(torch.cuda.Stream(device) for _ in range(3))
        return self._streams[device]

    def run(self, p: torch.Tensor, grad: torch.Tensor, host: dict[str, torch.Tensor],
            update: Callable[[dict[str, torch.Tensor]], None]) -> None:
        """Bring ``host`` states to p's device, ``update`` them with p, write them back."""
        if not p.is_cuda:
            # same path without streams, so CPU tests cover the copy-in / copy-out logic
            dev = {k: v.clone() for k, v in host.items()}
            update(dev)
            for k, v in dev.items():
                host[k].copy_(v)
            return
        h2d, compute, d2h = self._streams_for(p.device)
        ready = torch.cuda.Event()
        ready.record()  # p and its gradient as the current stream has left them
        buf = packed_buffer(host)
        sources = [buf] if buf is not None else list(host.values())
        with torch.cuda.stream(h2d):
            for t in sources:
                # the previous step's write-back of this host memory must land before re-reading it
                prev = self._writeback_of.pop(t.data_ptr(), None)
                if prev is not None:
                    h2d.wait_event(prev)
            if buf is not None:
                dev_buf = buf.to(p.device, non_blocking=True)
                dev = {k: dev_buf[v.storage_offset() * v.element_size():][:v.numel() * v.element_size()]
                       .view(v.dtype).view(v.shape) for k, v in host.items()}
                dev_tensors = [dev_buf]
            else:
                dev = {k: v.to(p.device, non_blocking=True) for k, v in host.items()}
                dev_tensors = list(dev.values())
        compute.wait_stream(h2d)
        compute.wait_event(ready)
        with torch.cuda.stream(compute):
            update(dev)
        d2h.wait_stream(compute)
        with torch.cuda.stream(d2h):
            if buf is not None:
                buf.copy_(dev_buf, non_blocking=True)
            else:
                for k, v in dev.items():
                    host[k].copy_(v, non_blocking=True)
        done = torch.cuda.Event()
        done.record(d2h)
        # the caching allocator must not hand these blocks out before the side streams finish
        for v in dev_tensors:
            v.record_stream(compute)
            v.record_stream(d2h)
        grad.record_stream(compute)
        for t in sources:
            self._writeback_of[t.data_ptr()] = done
        nbytes = sum(v.numel() * v.element_size() for v in dev_tensors)
        self._inflight.append((done, nbytes))
        self._inflight_bytes += nbytes
        while self._inflight_bytes > self.max_inflight_bytes and len(self._inflight) > 1:
            event, n = self._inflight.popleft()
            event.synchronize()
            self._inflight_bytes -= n

    def finish(self) -> None:
        """Make the current stream wait for every update issued so far (the next forward reads
        the updated weights); write-backs may still trail."""
        for _, compute, _ in self._streams.values():
            torch.cuda.current_stream(compute.device).wait_stream(compute)
        while self._inflight and self._inflight[0][0].query():
            self._inflight_bytes -= self._inflight.popleft()[1]

    def synchronize(self) -> None:
        for _, compute, d2h in self._streams.values():
            compute.synchronize()
            d2h.synchronize()
        self._inflight.clear()
        self._inflight_bytes = 0
        self._writeback_of.clear()
