"""Where a training step's time goes between the host and the GPU: one trainer's steps timed
several ways, and the GPU time between its micro-batches' starts.

Qwen2.5-0.5B, seq 4096, micro-batch 2, 4 micro-batches a step (bench/step.py's 0.5B case), for one
precision recipe. Its steps are timed
  plain; under torch.profiler (CPU and CUDA activities, each alone); with a host sync before each
  micro-batch (no run-ahead); plain again;
then CUDA events at each micro-batch's start give the GPU time from one start to the next (and from
the last one to the step's end: its backward, the grad norm and the optimizer), plainly and profiled.
A first micro-batch longer than the others is work done once a step before it (FP8: the weights'
re-quantization after the optimizer step).

    python bench/step_phases.py fp8_blockwise_ue8m0 [--out PATH]
"""
from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import base_parser, emit, markdown_table  # noqa: E402
from bench.step import bench_config  # noqa: E402
from infir.train.loop import Trainer  # noqa: E402


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("precision", help="a conf/precision name (bf16, fp8_blockwise_ue8m0, ...)")
    args = p.parse_args()
    prec = args.precision
    tr = Trainer(bench_config("qwen2.5-0.5b", 4096, 2, 4, "none", prec, 200, "single", f"/tmp/step_phases/{prec}"))
    for i in range(4):
        tr.train_step(i)
    torch.cuda.synchronize()
    forward = tr._forward

    def timed(n, ctx=contextlib.nullcontext, sync_mb=False):
        if sync_mb:
            def synced(mb):
                torch.cuda.synchronize()
                return forward(mb)
            tr._forward = synced
        ts = []
        for i in range(n):
            with ctx():
                t0 = time.perf_counter()
                tr.train_step(10 + i)
                torch.cuda.synchronize()
                ts.append(1e3 * (time.perf_counter() - t0))
        tr._forward = forward
        return ts

    steps, events = [], []

    def show(name, ts):
        steps.append({"precision": prec, "steps timed": name, "median ms": f"{statistics.median(ts):.1f}",
                      "each step (ms)": " ".join(f"{t:.1f}" for t in ts)})
        print(steps[-1], flush=True)

    profiled = lambda *acts: (lambda: profile(activities=list(acts)))
    show("plain", timed(8))
    show("profiler CPU+CUDA", timed(4, profiled(ProfilerActivity.CPU, ProfilerActivity.CUDA)))
    show("profiler CPU only", timed(4, profiled(ProfilerActivity.CPU)))
    show("profiler CUDA only", timed(4, profiled(ProfilerActivity.CUDA)))
    show("sync before each micro-batch", timed(8, sync_mb=True))
    show("plain again", timed(8))

    starts = []

    def marked(mb):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        starts.append(e)
        return forward(mb)

    tr._forward = marked
    ctxs = [contextlib.nullcontext] * 3 + [profiled(ProfilerActivity.CPU, ProfilerActivity.CUDA)] * 2
    for i, ctx in enumerate(ctxs):
        starts.clear()
        end = torch.cuda.Event(enable_timing=True)
        with ctx():
            t0 = time.perf_counter()
            tr.train_step(30 + i)
            end.record()
            torch.cuda.synchronize()
            wall = 1e3 * (time.perf_counter() - t0)
        spans = [a.elapsed_time(b) for a, b in zip(starts, starts[1:])]
        events.append({"precision": prec, "step": "profiled" if i >= 3 else "plain", "wall ms": f"{wall:.1f}",
                       "micro-batch starts apart (ms)": " ".join(f"{s:.1f}" for s in spans),
                       "last micro-batch start to step end (ms)": f"{starts[-1].elapsed_time(end):.1f}"})
        print(events[-1], flush=True)
    tr._forward = forward
    emit(f"Where a step's time goes: Qwen2.5-0.5B, seq 4096, {prec}",
         ["### steps timed plainly, profiled and without run-ahead", markdown_table(steps),
          "### GPU time between micro-batch starts (CUDA events)", markdown_table(events)], args.out)


if __name__ == "__main__":
    main()
