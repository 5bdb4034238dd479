"""Shared bench helpers: a header naming device, versions, command and date, markdown tables, and the
report written with its result file (bench/result_file.py)."""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys

import torch

if __package__:  # imported as bench._common
    from .result_file import write_result
else:  # imported as _common by a script run as `python bench/NAME.py`
    from result_file import write_result


def header() -> str:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.processor() or platform.machine()})"
    try:
        import triton

        triton_v = triton.__version__
    except ImportError:
        triton_v = "not installed"
    lines = [
        f"- device: {dev}",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton_v}, python {platform.python_version()}",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
    ]
    if settings := launch_settings():
        lines.append(f"- environment: {settings}")
    return "\n".join(lines)


def launch_settings() -> str:
    """The environment variables that change how kernels and collectives are issued (the hardware queues, NCCL's
    channels and protocols, the priority of torch's NCCL streams), as set for this run: part of how a timing
    was measured."""
    return " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                    if k in ("CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_NCCL_HIGH_PRIORITY")
                    or (k.startswith("NCCL_") and not k.endswith("_VERSION")))


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)"
    # every row's columns, first seen first: a case that failed (OOM) holds fewer figures than those after it
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(out)


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", help="also write the report (markdown) to this path, and its figures as JSON beside it "
                                 "(PATH.json), the result file bench/report.py reads")
    return p


def emit(title: str, sections: list[str], out: str | None) -> str:
    text = "\n\n".join([f"## {title}", header(), *sections]) + "\n"
    print(text, flush=True)
    if out:
        with open(out, "w") as f:
            f.write(text)
        write_result(out, text)
    return text


def capture_graph(fn, warmup: int = 3, sm_carveout: int | None = None):
    """fn captured in a CUDA graph, after `warmup` eager calls on a side stream (communicators, cuBLAS handles
    and autotuning are made before the capture, which takes none of them): the graph, and fn's output there,
    which each replay rewrites. `sm_carveout`: the SMs its cuBLASLt GEMMs leave to other kernels (torch's SM
    count target; None: none)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    previous = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(sm_carveout)
    try:
        with torch.cuda.graph(graph):
            out = fn()
    finally:
        torch._C._set_sm_carveout_experimental(previous)
    return graph, out


def bench_ms(fn, warmup: int = 10, rep: int = 50, min_reps: int = 10) -> float:
    """Median time of fn in milliseconds (CUDA events through triton.testing.do_bench), over at
    least min_reps runs. do_bench sizes its runs by time alone (rep ms, warmup ms), so a call that
    takes a sizeable fraction of rep would get the median of only a couple of timed runs. The run
    that sizes them is fn's second: a first call that builds kernels, autotunes or compiles is slow,
    and do_bench's warm-up and repeat times (2x and 10x the estimate) would then stretch an eager
    FP8 fwd+bwd whose first call builds the CUDA kernels past any time limit."""
    import triton.testing

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    est = start.elapsed_time(end)
    return float(triton.testing.do_bench(fn, warmup=max(warmup, 2 * est), rep=max(rep, min_reps * est),
                                         return_mode="median"))


def slowest_rank_ms(fn, group, warmup: int, iters: int) -> float:
    """ms per call of fn, which runs collectives over `group`: CUDA events around `iters` back-to-back calls
    after `warmup` (every rank makes the same calls, so none waits on a collective another never starts), the
    slowest rank's mean."""
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    dist.barrier(group=group)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    ms = torch.tensor([start.elapsed_time(end) / iters], device="cuda")
    dist.all_reduce(ms, op=dist.ReduceOp.MAX, group=group)
    return float(ms.item())


def kernel_times_us(fn, reps: int = 5) -> dict[str, tuple[float, int]]:
    """GPU us and launches per run of fn, by kernel name, from torch.profiler (a CUDA graph's replay
    counts each of its kernels)."""
    import os
    from collections import defaultdict

    # Kineto tears CUPTI down after each session and re-initialises it lazily at the next. torch keeps it up
    # under CUDA graphs only for CUDA < 12.6, and hangs of the profiler over graph replays are reported
    # upstream (tritonbench). The callers here profile graph replays, session after session, so CUPTI stays
    # up: a precaution against that hang, not a fix of one seen here.
    os.environ.setdefault("TEARDOWN_CUPTI", "0")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    us, calls = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[e.name] += e.device_time / reps
            calls[e.name] += 1
    return {name: (us[name], calls[name] // reps) for name in us}


def l2_flush():
    """What bench_ms (triton's do_bench) runs ahead of each timed run: a 256 MB fill, so that no
    operand starts in the 50 MB L2. Returns the callable."""
    buf = torch.empty(256_000_000, dtype=torch.int8, device="cuda")
    return buf.zero_


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth, counting bytes read + written (the HBM ceiling)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6
