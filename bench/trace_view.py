#!/usr/bin/env python3
"""Where a step's communication waits: a GPU timeline written by bench/step.py --trace, read offline.

    python bench/trace_view.py bench/results/DATE-COMMIT/trace/CASE_rank0.json.gz [--step 1] [--min-us 50]

For the profiled step asked for (the middle one by default): the step's span, each phase's first and last
compute kernel (forward and backward run back to back; the optimizer's kernels by name), and every
collective kernel with its start and end in ms from the step's start, its stream and how much of it ran
with no compute kernel beside it (exposed): what a collective queued behind another, or a forward waiting
on a gather, looks like. Compute from other steps counts as cover, as in bench/step.py's own figure.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step import STEP_MARK, _union, classify  # noqa: E402


def load(path: Path) -> tuple[list[list], list[list]]:
    """(step annotations, kernels) of a trace, each [name, stream, start_us, end_us], by start."""
    events = json.load(gzip.open(path, "rt"))["events"]
    # a step's annotation is on every stream its kernels ran on (inductor's and NCCL's too): its first one
    first: dict[str, list] = {}
    for e in events:
        if e[0].startswith(STEP_MARK) and (e[0] not in first or e[2] < first[e[0]][2]):
            first[e[0]] = e
    marks = sorted(first.values(), key=lambda e: e[2])
    kernels = sorted((e for e in events if not e[0].startswith(STEP_MARK) and not e[0].startswith("nccl:")
                      and not e[0].startswith("Optimizer.")), key=lambda e: e[2])
    return marks, kernels


def uncovered_us(a: float, b: float, busy: list[tuple[float, float]]) -> float:
    covered = sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in busy if lo < b and hi > a)
    return (b - a) - covered


def view(path: Path, step: int | None, min_us: float) -> str:
    marks, kernels = load(path)
    if len(marks) < 2:
        sys.exit(f"trace_view: {path} holds {len(marks)} step annotation(s): it needs two or more steps "
                 "(bench/step.py --profile --trace writes three)")
    i = len(marks) // 2 - (len(marks) % 2 == 0) if step is None else step
    if not 0 <= i < len(marks) - 1:
        sys.exit(f"trace_view: --step {step} is outside the trace's steps 0..{len(marks) - 2} with a next one")
    lo, hi = marks[i][2], marks[i + 1][2]
    inside = [k for k in kernels if lo <= k[2] < hi]
    busy = _union([(k[2], k[3]) for k in kernels if classify(k[0]) != "communication"])
    lines = [f"{path.name}: step {i}, {(hi - lo) / 1e3:.1f} ms from its first kernel to the next step's"]
    # the optimizer's step follows the last GEMM: "foreach" kernels inside the forward (weight refreshes, copies
    # of gathered parameters) are not part of it
    gemms = [k for k in inside if classify(k[0]) == "gemm"]
    end = max((k[3] for k in gemms), default=lo)
    opt = [k for k in inside if classify(k[0]) == "optimizer" and k[2] >= end]
    compute = [k for k in inside if classify(k[0]) not in ("communication", "optimizer") and k[2] < end]
    for label, ks in (("forward+backward", compute), ("optimizer", opt)):
        if ks:
            lines.append(f"  {label}: {(ks[0][2] - lo) / 1e3:.2f} .. {(max(k[3] for k in ks) - lo) / 1e3:.2f} ms")
    total = 0.0
    lines.append("  collectives (ms from the step's start: start, end, length, exposed; stream; kernel):")
    for name, stream, a, b in (k for k in inside if classify(k[0]) == "communication"):
        exposed = uncovered_us(a, b, busy)
        total += exposed
        if b - a >= min_us:
            lines.append(f"    {(a - lo) / 1e3:8.2f} {(b - lo) / 1e3:8.2f} {(b - a) / 1e3:6.2f} {exposed / 1e3:6.2f}"
                         f"  s{stream}  {name[:70]}")
    lines.append(f"  exposed collective time: {total / 1e3:.1f} ms of the step's {(hi - lo) / 1e3:.1f} ms")
    # from the last GEMM to the next step the GPU waits on the host wherever no kernel runs: launch-bound
    # optimizer steps, host syncs, the next batch
    idle = uncovered_us(end, hi, _union([(k[2], k[3]) for k in inside if k[3] > end]))
    lines.append(f"  after the last GEMM: {(hi - end) / 1e3:.1f} ms to the next step, "
                 f"the GPU idle {idle / 1e3:.2f} ms of it")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--step", type=int, default=None, help="which profiled step (default: the middle one)")
    p.add_argument("--min-us", type=float, default=0.0, help="list only collectives at least this long")
    args = p.parse_args()
    if not args.trace.is_file():
        sys.exit(f"trace_view: {args.trace} does not exist: pass a file bench/step.py --trace wrote")
    print(view(args.trace, args.step, args.min_us))


if __name__ == "__main__":
    main()
