"""End-to-end training-step throughput of infir's megatron trainer on one GPU, or on several under torchrun.

For each case (model x seq x recompute x precision) it builds the real Trainer on synthetic tokens,
warms up, times optimizer steps, and reports tokens/s, TFLOP/s, MFU (of the 989 TFLOP/s dense BF16
spec peak and of the GEMM ceiling measured here at the model's own shapes) and peak memory. With
--profile it also splits one step's GPU time into block GEMMs / LM head / attention / optimizer /
other, which gives f, the share FP8 can speed up. Precisions `hf_bf16` and `hf_torchao_tensorwise` run
the HF transformers peer at the same shape (bench/hf_peer.py), and the report compares us with it.

    python bench/step.py --models qwen2.5-0.5b qwen2.5-1.5b --seq 4096 --mbs 2 --recompute none selective

Tensor parallel: launch with torchrun and name a conf/parallel (TFLOP/s and MFU are per GPU, the
GEMM ceiling and r are measured at one rank's shards of the shapes; rank 0 reports):

    torchrun --nproc_per_node 2 bench/step.py --parallel tp2 --models qwen2.5-7b --mbs 1 --accum 4 \
        --cases qwen2.5-7b:none:bf16 qwen2.5-7b:none:fp8_blockwise_ue8m0 \
                qwen2.5-7b:none:fp8_blockwise_ue8m0+parallel.sequence_parallel=false

Packed documents (InfiR2's SFT shape): `+data.synthetic_doc_median=2048` packs each row from documents of
log-normal lengths (median 2048 tokens, sigma 1); context parallelism: `+parallel.cp=2` (launch tp x cp
ranks). Each row also gives TFLOP/s as Megatron-LM counts it (infir.train.flops.megatron_lm_flops_per_token:
the whole score square), the count of Megatron-based reports such as InfiR2's Table 6.
"""
from __future__ import annotations

import bisect
import gc
import gzip
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import base_parser, bench_ms, emit, markdown_table  # noqa: E402
from hf_peer import HF_PRECISIONS  # noqa: E402

SPEC_PEAK = 989.0
CLOCK_SAMPLE_MS = 0.0  # --clock-sample-ms: how often PowerMeter reads the SM clock (0: never)
TRACE_DIR = None  # --trace: where profile_step writes each rank's GPU timeline (save_trace)
BESIDE: tuple[Path, int] | None = None  # --beside: where the processes timed at once meet, and how many they are
_meetings = 0  # the timed runs this process has begun: the same count in every process of one --beside


def block_shapes(size, tp: int = 1) -> list[tuple[int, int]]:
    """(K, N) of one TP rank's QKV, proj, FC1 (gate+up) and FC2 GEMMs: column-parallel ones split N,
    row-parallel ones K."""
    d, kv, f = size.hidden, size.kv_heads * size.head_dim, size.ffn
    return [(d, (d + 2 * kv) // tp), (d // tp, d), (d, 2 * f // tp), (f // tp, d)]


def gemm_ceiling(size, tokens: int, tp: int = 1) -> float:
    """BF16 TFLOP/s of the model's own matmuls (fwd shapes of QKV, proj, FC1, FC2, LM head), time-weighted."""
    flops = ms = 0.0
    for k, n in [*block_shapes(size, tp), (size.hidden, size.vocab // tp)]:
        a = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        t = bench_ms(lambda: a @ w.t())
        flops += 2 * tokens * k * n
        ms += t
    return flops / (ms * 1e-3) / 1e12


def fp8_gemm_speedup(size, tokens: int, tp: int = 1, rounds: int = 5) -> float:
    """r: time of the block GEMMs (fwd shapes) in BF16 over blockwise FP8 (scaled_mm, UE8M0), summed.
    Each shape's two sides are timed in turn `rounds` times and each side's median kept: with one
    timing of each, r (and the ceiling with it) varied noticeably between runs at 0.5B."""
    from infir.fp8 import fp8_gemm, quantize

    bf16_ms = fp8_ms = 0.0
    for k, n in block_shapes(size, tp):
        a = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        qa, qw = quantize(a, "token", "ue8m0"), quantize(w, "block", "ue8m0")
        times = [(bench_ms(lambda: a @ w.t()),
                  bench_ms(lambda: fp8_gemm(qa, qw, out_dtype=torch.bfloat16, backend="scaled_mm")))
                 for _ in range(rounds)]
        b, f = (sorted(side)[rounds // 2] for side in zip(*times))
        print(f"r at {tokens}x{k}x{n}: bf16 {b * 1e3:.1f} us, fp8 {f * 1e3:.1f} us, {b / f:.2f}x; rounds (bf16/fp8 us): "
              + " ".join(f"{x * 1e3:.0f}/{y * 1e3:.0f}" for x, y in times), flush=True)
        bf16_ms += b
        fp8_ms += f
    return bf16_ms / fp8_ms


def lm_head_ms(size, tokens: int, tp: int = 1) -> float:
    """The LM head's three GEMMs (logits, dH, dW) in BF16, for separating them from the block GEMMs."""
    h = torch.randn(tokens, size.hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(size.vocab // tp, size.hidden, device="cuda", dtype=torch.bfloat16)
    return 3 * bench_ms(lambda: h @ w.t())


def classify(name: str) -> str:
    n = name.lower()
    if n.startswith("nccl"):  # TP/SP collectives, kept apart from compute (exposed_communication)
        return "communication"
    if n.startswith("memcpy ptop") or "symmetric_memory::barrier" in n:
        # the copy-engine transport of the split TP schedules (sp_overlap): its peer copies and the waits
        # for a peer's signal are its collectives, exposed where no compute kernel runs beside them
        return "communication"
    if any(k in n for k in ("adam", "multi_tensor", "foreach")):  # before "flash": _flash_adamw_kernel
        return "optimizer"
    if any(k in n for k in ("flash", "fmha", "attention", "attn")):
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "xmma", "cutlass", "matmul", "sm90")):
        return "gemm"
    if "swiglu" in n and "quant_token_both" in n:
        # SwiGLU fused with the quantizer of FC1's gradient / FC2's input (quant_both.cu's SwigluBwdRows,
        # SwigluFwdRows): its own class, so that neither the quantize nor the elementwise share hides it
        return "swiglu+quantize (fused)"
    if "swiglu" in n:  # FP8 recipes' SwiGLU kernels (which also quantize its saved input) replace BF16's fused one
        return "elementwise/other"
    if any(k in n for k in ("quant_block", "range_quant", "range_amax")) and not n.startswith("triton_"):
        # the FP8 weights' 128x128-block quantizers (whole weights, or a rank's range under the FP8 parameter
        # gather): work per weight element, not per token, which the scaling model prices apart
        return "weight quantize"
    # inductor's own kernels are named after the graph nodes around them: an RMSNorm feeding the
    # quantize op came out as triton_red_fused_..._fp8_quantize_pair_mean_..._rsqrt (ours: _quant_*, quant_*)
    if any(k in n for k in ("quant", "fp8", "cast_to")) and not n.startswith("triton_"):
        return "quantize"
    if any(k in n for k in ("nll", "cross_entropy", "log_softmax", "softmax")):
        return "loss"
    if any(k in n for k in ("copy", "fill", "memcpy", "memset")):
        return "copies"
    return "elementwise/other"


PROFILED_STEPS = 3  # profiled back to back; the middle one is measured
STEP_MARK = "bench_profiled_step_"


def profile_step(trainer, label: str = "step") -> dict[str, float]:
    """GPU time by kernel class and the exposed communication of one step in steady state: the middle of
    three profiled steps. A lone profiled step ends with its parameter gathers and nothing beside them
    (the next forward would run there), and starts with ranks that the profiler's start set apart."""
    from torch.profiler import ProfilerActivity, profile, record_function

    meter = PowerMeter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for i in range(PROFILED_STEPS):
            with record_function(f"{STEP_MARK}{i}"):
                trainer.train_step(trainer.step)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    meter.close()
    clock = meter.mean_clock(t0, t0 + wall)
    print(f"profiled steps' wall time: {wall * 1e3 / PROFILED_STEPS:.1f} ms a step (profiler overhead included)"
          + ("" if clock is None else f"; mean SM clock {clock:.0f} MHz"), flush=True)
    host_report(prof)
    kernels = kernel_spans(prof)
    if TRACE_DIR:
        save_trace(prof, trainer, label)
    return step_profile(kernels, middle_step(prof, kernels))


def save_trace(prof, trainer, label: str) -> None:
    """The profiled steps' GPU timeline of this rank, compact (a Chrome trace of them runs to tens of MB):
    every kernel and GPU-side annotation as [name, stream, start_us, end_us], gzipped JSON in TRACE_DIR,
    named by case and rank, for reading a step's overlap offline."""
    rows = [[e.name, getattr(e, "device_resource_id", 0), e.time_range.start, e.time_range.end] for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    name = re.sub(r"[^\w.=+-]+", "_", label)
    path = Path(TRACE_DIR) / f"{name}_rank{trainer.info.rank}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"window_mark": STEP_MARK, "events": rows}, f)
    print(f"GPU timeline of the profiled steps: {path}", flush=True)


def kernel_spans(prof) -> list[tuple[str, int, int]]:
    """(name, start, end) in us of every kernel in the profile (not the annotations over them)."""
    return [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
            and not _annotation(e)]


def middle_step(prof, kernels: list[tuple[str, int, int]]) -> tuple[int, int]:
    """The GPU span (us) of the middle profiled step: from the GPU-side start of its record_function range to
    that of the next step. Without those GPU annotations: the middle third of the kernels' span."""
    starts = {e.name: e.time_range.start for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.CUDA and e.name.startswith(STEP_MARK)}
    middle = PROFILED_STEPS // 2
    lo, hi = starts.get(f"{STEP_MARK}{middle}"), starts.get(f"{STEP_MARK}{middle + 1}")
    if lo is not None and hi is not None and hi > lo:
        return lo, hi
    a, b = min(k[1] for k in kernels), max(k[2] for k in kernels)
    print("no GPU-side step annotations in the profile: the middle third of its span is measured", flush=True)
    return a + (b - a) * middle // PROFILED_STEPS, a + (b - a) * (middle + 1) // PROFILED_STEPS


def step_profile(kernels: list[tuple[str, int, int]], window: tuple[int, int]) -> dict[str, float]:
    """Shares of the kernel time of the kernels (name, start, end) that start inside `window`, by class
    (`classify`), with the all-gathers' share and the exposed communication (exposed_communication)."""
    lo, hi = window
    inside = [k for k in kernels if lo <= k[1] < hi]
    share: dict[str, float] = {}
    by_name: dict[str, list] = {}
    for name, a, b in inside:
        share[classify(name)] = share.get(classify(name), 0.0) + (b - a)
        entry = by_name.setdefault(name, [0, 0])
        entry[0], entry[1] = entry[0] + (b - a), entry[1] + 1
    total = sum(share.values())
    if not total:
        return {}
    top = sorted(((t, n, k) for k, (t, n) in by_name.items()), reverse=True)[:25]
    print("top kernels (one step):\n" + "\n".join(f"  {100 * t / total:5.1f}% x{n:<4d} {k[:150]}" for t, n, k in top), flush=True)
    # GPU-busy time beside the step's wall time: their gap is time the GPU waited on the host
    print(f"kernel time in the measured step: {total / 1e3:.1f} ms", flush=True)
    out = {k: v / total for k, v in sorted(share.items(), key=lambda kv: -kv[1])}
    gathers = sum(b - a for name, a, b in inside if classify(name) == "communication" and "allgather" in name.lower())
    if gathers:  # of the communication: the all-gathers (ZeRO-1's parameter gather, SP's activation gather)
        out["all-gather"] = gathers / total
    exposed = exposed_communication(kernels, window)
    if exposed:  # of the kernel time: the step's GPU time waiting on a collective alone
        out["exposed communication"] = exposed / total
    return out


def _annotation(evt) -> bool:
    """GPU-side annotations: spans over kernels that are counted already. record_function ranges (the
    optimizers' `Optimizer.step#AdamW.step`) and the profiler's "nccl:<op>" rows over a collective's kernel."""
    return bool(getattr(evt, "is_user_annotation", False)) or evt.key.startswith("nccl:")


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def exposed_communication(kernels: list[tuple[str, int, int]], window: tuple[int, int]) -> float:
    """How much time (us) inside `window` a collective's kernel ran with no compute kernel beside it: the
    communication the step waits for. Compute from outside the window counts as cover too (the next
    step's forward beside this step's parameter gathers). A collective's kernel also spans the wait for
    the slower rank, so its own length overstates the wire time; the exposed part is what costs the step."""
    lo, hi = window
    comm = [(n, max(a, lo), min(b, hi)) for n, a, b in kernels if classify(n) == "communication" and a < hi and b > lo]
    if not comm:
        return 0.0
    busy = _union([(a, b) for n, a, b in kernels if classify(n) != "communication"])
    starts = [x for x, _ in busy]

    def uncovered(a: int, b: int) -> int:
        j = max(bisect.bisect_right(starts, a) - 1, 0)  # the first compute span that can overlap [a, b)
        covered = 0
        while j < len(busy) and busy[j][0] < b:
            covered += max(0, min(b, busy[j][1]) - max(a, busy[j][0]))
            j += 1
        return (b - a) - covered

    exposed = sum(uncovered(a, b) for a, b in _union([(a, b) for _, a, b in comm]))
    total = sum(b - a for _, a, b in comm)
    print(f"communication kernels: {total / 1e3:.1f} ms in the measured step, {exposed / 1e3:.1f} ms of it "
          f"with no compute kernel beside it (exposed)", flush=True)
    print("exposed by collective and by tenth of the step (ms): " + exposed_by_op(comm, uncovered, window), flush=True)
    return exposed


def exposed_by_op(comm: list[tuple[str, int, int]], uncovered, window: tuple[int, int]) -> str:
    """Where the exposed communication lies: per collective (ReduceScatter, AllGather, ...; overlapping
    kernels of two collectives count for both) and in which tenth of the step it starts, which tells a
    gradient bucket left at the end of backward from a parameter gather the forward waits on."""
    lo, hi = window
    per: dict[str, list[float]] = {}
    for name, a, b in comm:
        op = ("barrier" if "symmetric_memory::barrier" in name else
              re.sub(r"^nccl(DevKernel_)?", "", name).split("_")[0].split(" (")[0] or name)
        tenths = per.setdefault(op, [0.0] * 10)
        tenths[min(9, int(10 * (a - lo) / max(1, hi - lo)))] += uncovered(a, b) / 1e3
    return "; ".join(f"{op} {sum(t):.1f} [" + " ".join(f"{x:.1f}" for x in t) + "]" for op, t in sorted(per.items()))


def host_report(prof) -> None:
    """What the CPU did in the profiled step: where a step is host-bound (kernel time well under the
    step's wall time), these name the work that kept the GPU waiting."""
    from torch._dynamo.utils import counters

    cpu = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU]
    launches = sum(e.count for e in cpu if "LaunchKernel" in e.key or e.key.startswith("cuLaunch"))
    print(f"kernel launches in the profiled steps: {launches / PROFILED_STEPS:.0f} a step", flush=True)
    top = sorted(cpu, key=lambda e: e.self_cpu_time_total, reverse=True)[:20]
    print(f"top host ops by self CPU time ({PROFILED_STEPS} profiled steps):\n" + "\n".join(
        f"  {e.self_cpu_time_total / 1e3:8.1f} ms x{e.count:<6d} {e.key[:120]}" for e in top), flush=True)
    breaks = {k.splitlines()[0][:100]: n for k, n in counters["graph_break"].items()}
    print(f"dynamo so far in this process: {dict(counters['stats'])}, graph breaks: {breaks}", flush=True)
    gpu_gaps(prof)


def gpu_gaps(prof, top: int = 6, min_ms: float = 0.5) -> None:
    """The longest stretches with no kernel on the GPU, and the host ops that ran through them."""
    evts = prof.events()
    busy = sorted((e.time_range.start, e.time_range.end) for e in evts
                  if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    if not busy:
        return
    gaps, end = [], busy[0][1]
    for a, b in busy[1:]:
        if a > end:
            gaps.append((a - end, end, a))
        end = max(end, b)
    idle = sum(g for g, _, _ in gaps if g >= min_ms * 1e3)
    print(f"GPU idle inside the profiled steps: {idle / 1e3:.1f} ms in gaps of >= {min_ms} ms", flush=True)
    # many short gaps (a graph replay's start, a launch behind a full queue) can cost as much as the long ones
    print("GPU idle by gap length: " + ", ".join(
        f"{label}: {n} gaps, {t / 1e3:.2f} ms" for label, n, t in gap_histogram([g for g, _, _ in gaps])), flush=True)
    cpu = [e for e in evts if e.device_type == torch.autograd.DeviceType.CPU]
    for g, a, b in sorted(gaps, reverse=True)[:top]:
        inside = sorted(((min(e.time_range.end, b) - max(e.time_range.start, a), e.name) for e in cpu
                         if e.time_range.start < b and e.time_range.end > a), reverse=True)[:6]
        print(f"  gap {g / 1e3:.2f} ms: " + "; ".join(f"{n[:60]} ({d / 1e3:.2f})" for d, n in inside), flush=True)


GAP_BINS_US = (10, 100, 500)


def gap_histogram(gaps_us: list[float]) -> list[tuple[str, int, float]]:
    """(label, count, total us) of the gaps in each length bin of GAP_BINS_US, and in all."""
    edges = (0,) + GAP_BINS_US + (float("inf"),)
    rows = []
    for lo, hi in zip(edges, edges[1:]):
        inside = [g for g in gaps_us if lo <= g < hi]
        rows.append((f"<{hi:g} us" if lo == 0 else f">={lo:g} us" if hi == float("inf") else f"{lo:g}-{hi:g} us",
                     len(inside), sum(inside)))
    rows.append(("all", len(gaps_us), sum(gaps_us)))
    return rows


class PowerMeter:
    """This GPU's energy and the time its clocks were held down by the power cap, read from NVML's
    running counters around each timed step, and (every CLOCK_SAMPLE_MS, from a thread) its SM clock.
    An H100 under load sits at its power cap and moves its SM clock: these readings tell a difference
    between two runs' steps that is the GPU's from one that is the code's (a step slower than its kernel time
    at a higher clock waited on the host, not on the power cap). Without NVML (pynvml not installed) it reads nothing."""

    def __init__(self):
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        except Exception as e:  # no pynvml, no driver access: the bench runs on without these columns
            print(f"NVML unavailable ({e}); no per-step power readings", flush=True)
            self.nvml = None
        if self.nvml is not None and CLOCK_SAMPLE_MS > 0:
            threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._stop.wait(CLOCK_SAMPLE_MS / 1e3):
            clock = self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)
            self.samples.append((time.perf_counter(), clock))

    def close(self) -> None:
        self._stop.set()

    def mean_clock(self, t0: float, t1: float) -> float | None:
        """The mean of the SM clock samples (MHz) taken in [t0, t1)."""
        inside = [c for t, c in self.samples if t0 <= t < t1]
        return sum(inside) / len(inside) if inside else None

    def read(self) -> tuple[float, float] | None:
        """(energy in J, power-capped seconds), both counted since the driver loaded."""
        if self.nvml is None:
            return None
        capped = self.nvml.nvmlDeviceGetViolationStatus(self.handle, self.nvml.NVML_PERF_POLICY_POWER)
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3, capped.violationTime / 1e9


def meet_beside(timeout_s: float = 900.0) -> None:
    """--beside DIR:N: wait, warmed up, until the N processes (one per GPU, with no communication between them)
    have all come to this timed run, so that their timed steps run at once: what N GPUs of one host give when
    all of them are busy (each at its own power cap and clocks, the host's CPUs and memory shared), against
    which a data-parallel step's communication is what remains. A file per process under DIR/<the run's ordinal> marks who has come."""
    global _meetings
    if BESIDE is None:
        return
    folder, n = BESIDE
    here = folder / str(_meetings)
    _meetings += 1
    here.mkdir(parents=True, exist_ok=True)
    (here / str(os.getpid())).touch()
    deadline = time.monotonic() + timeout_s
    while len(list(here.iterdir())) < n:
        if time.monotonic() > deadline:
            sys.exit(f"step.py: --beside {folder}:{n}: {len(list(here.iterdir()))} of {n} processes came to timed run "
                     f"{_meetings - 1} in {timeout_s:.0f} s; start all {n} with the same --cases and an empty {folder}")
        time.sleep(0.02)


def time_steps(step, steps: int, tokens_per_step: int, flops_per_token: float, gpus: int = 1) -> dict:
    """step(i) three times to warm up (compile, autotune), then `steps` timed: the throughput
    columns (from the median step time; TFLOP/s and MFU per GPU of the `gpus` sharing the step), and
    the peak memory since the caller reset it: of allocated tensors, and held by the caching allocator (reserved,
    which alone counts CUDA graphs' memory pools: graph replays write there without allocating)."""
    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    meet_beside()
    times, spans, power, meter = [], [], [], PowerMeter()
    for i in range(steps):  # every step ends in a host sync (the loss's .item()), so timing each adds none
        before = meter.read()
        t0 = time.perf_counter()
        step(3 + i)
        torch.cuda.synchronize()
        spans.append((t0, time.perf_counter()))
        times.append(spans[-1][1] - t0)
        after = meter.read()
        if before and after:
            power.append(((after[0] - before[0]) / times[-1], after[1] - before[1]))
    meter.close()
    print("timed steps (ms): " + " ".join(f"{1e3 * t:.1f}" for t in times), flush=True)
    if power:
        print("their mean power (W): " + " ".join(f"{w:.0f}" for w, _ in power), flush=True)
        print("their time under the power cap (ms): " + " ".join(f"{1e3 * c:.0f}" for _, c in power), flush=True)
    clocks = [meter.mean_clock(*span) for span in spans]
    if any(c is not None for c in clocks):
        print("their mean SM clock (MHz): " + " ".join("-" if c is None else f"{c:.0f}" for c in clocks), flush=True)
    dt = sorted(times)[len(times) // 2]  # the median: one slow step (a late allocation, a hiccup) sways a mean of few
    tps = tokens_per_step / dt
    tflops = tps * flops_per_token / 1e12 / gpus
    return {"step_ms": dt * 1e3, "tokens/s": round(tps), "TFLOP/s": tflops, "MFU(spec)": tflops / SPEC_PEAK,
            "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_GiB": torch.cuda.max_memory_reserved() / 2**30}


def run_hf_case(model: str, seq: int, mbs: int, accum: int, recompute: str, precision: str, steps: int) -> dict:
    """The HF transformers peer (bench/hf_peer.py) at our model's shape, timed as run_case times ours."""
    from hf_peer import HfTrainer

    from infir.model.qwen import get_size
    from infir.train.flops import flops_per_token

    if recompute != "none":
        raise ValueError(f"the HF peer runs without recomputation, got recompute={recompute}")
    size = get_size(model)
    torch.cuda.reset_peak_memory_stats()
    peer = HfTrainer(size, precision, seq=seq, mbs=mbs, accum=accum, device="cuda")
    row = {"model": model, "precision": precision, "seq": seq, "mbs": mbs, "accum": accum, "recompute": recompute,
           **time_steps(lambda i: peer.train_step(), steps, peer.tokens_per_step, flops_per_token(size, seq))}
    return row


def memory_split(trainer) -> dict[str, float]:
    """Where peak memory goes: what stays allocated between steps (weights, main grads, optimizer
    states, FP8 weight caches), what one micro-batch's forward leaves for its backward (saved
    activations), and the peak of that micro-batch's forward + backward. The next step zeroes the
    gradient buffers first, so this extra pass changes no result; under optimizer.grad_release its backward
    also steps the parameters, as a step's does (the peak is then the release's), and no timing follows.
    Under CUDA-graphed layers the activations live in the graphs' memory pool, which replays write without
    allocating: its size is given instead of the micro-batch's figures."""
    torch.cuda.synchronize()
    static = torch.cuda.memory_allocated()
    if trainer.graphed:
        pools = [seg["total_size"] for seg in torch.cuda.memory_snapshot()
                 if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0)]  # private pools: the graphs'
        return {"static_GiB": static / 2**30, "graph_pool_GiB": sum(pools) / 2**30}
    mb = trainer._micro_batches(trainer.step)[0]
    torch.cuda.reset_peak_memory_stats()
    loss = trainer._forward(mb)
    torch.cuda.synchronize()
    saved = torch.cuda.memory_allocated() - static
    loss.backward()
    del loss
    torch.cuda.synchronize()
    return {"static_GiB": static / 2**30, "saved_act_GiB": saved / 2**30,
            "mb_peak_GiB": torch.cuda.max_memory_allocated() / 2**30}


def bench_config(model: str, seq: int, mbs: int, accum: int, recompute: str, precision: str, iters: int,
                 parallel: str, run_dir: str):
    """The trainer's config for a timed case: synthetic tokens, no logger, checkpoints or validation.
    precision as run_case takes it."""
    from infir.train.cli import compose

    name, _, extra = precision.partition("+")
    cfg = compose([*(o for o in extra.split(",") if o), f"parallel={parallel}",
        f"model={model}", f"precision={name}", "data=synthetic", "logger=none", "scale=full",
        "model.cpu_init=false",  # random weights made on the GPU: CPU init of a 7B model takes minutes and times nothing
        f"model.recompute={recompute}", f"stage.seq_length={seq}", f"stage.micro_batch={mbs}",
        f"stage.global_batch={mbs * accum}", f"stage.iters={iters}", "stage.warmup_iters=10",
        f"run_dir={run_dir}", "train.save_interval=1000000", "train.eval_interval=0",
        "train.async_save=false",  # no host buffers for checkpoints a timed case never writes
    ])
    # `accum` micro-batches per rank and step at any data-parallel size: DP=2 is twice DP=1's global batch
    dp = int(os.environ.get("WORLD_SIZE", "1")) // (cfg.parallel.tp * cfg.parallel.cp)
    cfg.stage.global_batch = mbs * accum * max(dp, 1)
    return cfg


def run_case(model: str, seq: int, mbs: int, accum: int, recompute: str, precision: str, steps: int, profile: bool,
             parallel: str = "single") -> dict:
    """precision: a conf/precision name, optionally followed by "+" and comma-separated Hydra
    overrides (fp8_blockwise_ue8m0+precision.fp8_swiglu_input=false, bf16+parallel.sequence_parallel=false)."""
    from infir.train.flops import megatron_lm_flops_per_token
    from infir.train.loop import Trainer

    name = precision.partition("+")[0]
    cfg = bench_config(model, seq, mbs, accum, recompute, precision, steps + 100, parallel,
                       f"/tmp/bench_step/{model}-{name}-{seq}-{recompute}")
    # A torn-down FP8 trainer can leave memory allocated on the GPU: memory is reported net of what an
    # earlier case left, so each row's figures are its own.
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(cfg)
    tp = cfg.parallel.tp
    tokens = mbs * seq // cfg.parallel.cp  # one rank's tokens per micro-batch: what its GEMMs see

    def step(i):  # as the training loop steps: train.gc_interval's collections at its step boundaries
        trainer.train_step(trainer.step + i)
        trainer.gc.after_step(trainer.step + i + 1)

    with trainer.gc:
        timed = time_steps(step, steps, trainer.tokens_per_step, trainer.flops_per_token, trainer.info.world_size)
    row = {"model": model, "precision": precision, "seq": seq, "mbs": mbs, "accum": accum, "recompute": recompute,
           **timed, "cuda_graphs": trainer.graphed}
    tflops = row["TFLOP/s"]
    row["TFLOP/s (Megatron-LM count)"] = tflops * megatron_lm_flops_per_token(trainer.size, seq) / trainer.flops_per_token
    row.update(memory_split(trainer))
    row["optim_state_GiB"] = trainer.optimizer.state_bytes(torch.device("cuda", torch.cuda.current_device())) / 2**30
    row["sharded_states"] = trainer.optimizer.sharded
    row["tp_comm_overlap"] = trainer.model.module.config.tp_comm_overlap  # as megatron's config took it (SP, TP > 1)
    if trainer.optimizer.sharded:  # what each rank sends in a step's parameter all-gathers
        row["param_gather_MiB"] = trainer.optimizer.gather_bytes / 2**20
    # Net of the tensors an earlier case left allocated; what it left cached, unallocated, this case could reuse
    # and counts as its own where it stays reserved
    for key in ("peak_mem_GiB", "peak_reserved_GiB", "static_GiB", "mb_peak_GiB"):
        if key in row:
            row[key] -= held / 2**30
    if held > 2**28:
        row["held_before_GiB"] = held / 2**30
    ceiling = gemm_ceiling(trainer.size, tokens, tp)
    row["GEMM_ceiling_TFLOP/s"] = ceiling
    row["MFU(ceiling)"] = tflops / ceiling
    if profile:
        prof = profile_step(trainer, f"{model}_{precision}_s{seq}_a{accum}")
        row["profile"] = prof
        if name == "bf16":
            # f: the share FP8 can speed up (block GEMMs, fwd + bwd; LM-head GEMMs taken out).
            # the LM head runs once per micro-batch: `accum` times a step
            lm = accum * lm_head_ms(trainer.size, tokens, tp) / row["step_ms"]
            f = max(prof.get("gemm", 0.0) - lm, 0.0)
            r = fp8_gemm_speedup(trainer.size, tokens, tp)
            row.update({"f_block_gemm": f, "r_fp8_gemm": r, "fp8_ceiling": 1.0 / ((1 - f) + f / r)})
    trainer.close()  # its pending parameter gathers waited for: cases torn down with them left the parameter buffer allocated
    return row


def setting(precision: str) -> list[str]:
    """A case's overrides other than the precision's own (parallel.*, model.*): what its BF16 base shares."""
    return sorted(o for o in precision.partition("+")[2].split(",") if o and not o.startswith("precision."))


def bf16_base(row: dict, rows: list[dict]) -> dict | None:
    """The BF16 case an FP8 case is compared with, among those of its model, seq and recompute: the
    one with the same overrides (other than precision.*: SP off is compared with SP off), else the
    fastest of those that differ from it only in model.compile_mode, an execution choice (FP8 with
    CUDA graphs against plain BF16, where BF16 ran only without them)."""
    same_shape = [b for b in rows if b.get("precision", "").partition("+")[0] == "bf16"
                  and isinstance(b.get("step_ms"), float) and all(b[k] == row[k] for k in ("model", "seq", "recompute"))]
    same = [b for b in same_shape if setting(b["precision"]) == setting(row["precision"])]
    if same:
        return same[0]
    def but_mode(prec):
        return [o for o in setting(prec) if not o.startswith("model.compile_mode=")]
    pool = [b for b in same_shape if but_mode(b["precision"]) == but_mode(row["precision"])]
    return min(pool, key=lambda b: b["step_ms"]) if pool else None


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    p.add_argument("--seq", nargs="+", type=int, default=[4096])
    p.add_argument("--mbs", type=int, default=2)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--recompute", nargs="+", default=["none", "selective"])
    p.add_argument("--precision", nargs="+", default=["bf16"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--clock-sample-ms", type=float, default=0.0,
                   help="also read the SM clock this often (ms) from a thread and print each step's mean")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="with --profile: write each rank's GPU timeline of the profiled steps to DIR (save_trace)")
    p.add_argument("--beside", default=None, metavar="DIR:N",
                   help="one of N processes started at once, one per GPU (CUDA_VISIBLE_DEVICES), no communication "
                        "between them: each case's timed steps wait for all N (meeting under the empty folder DIR)")
    p.add_argument("--parallel", default="single", help="a conf/parallel name (tp2: launch 2 ranks with torchrun)")
    p.add_argument("--cases", nargs="*", default=None,
                   help="explicit MODEL:RECOMPUTE:PRECISION[+OVERRIDE,...] triples instead of the full cross "
                        "product (overrides: Hydra ones for that case); "
                        f"PRECISION may also be an HF transformers peer: {', '.join(HF_PRECISIONS)}")
    args = p.parse_args()
    global CLOCK_SAMPLE_MS, TRACE_DIR, BESIDE
    CLOCK_SAMPLE_MS = args.clock_sample_ms
    TRACE_DIR = args.trace
    if args.beside:
        folder, _, n = args.beside.rpartition(":")
        if not folder or not n.isdigit() or int(n) < 1:
            p.error(f"--beside {args.beside}: expected DIR:N (a folder and how many processes meet there)")
        BESIDE = (Path(folder), int(n))
    rank = int(os.environ.get("RANK", "0"))
    reporting = rank == 0  # every rank runs every case; rank 0 reports
    if not reporting:  # the other ranks' own timings and profiles: a slow rank shows up in its log
        log = Path(args.out).with_suffix(f".rank{rank}.log") if args.out else Path(os.devnull)
        if args.out:
            log.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout = open(log, "w", buffering=1)
    torch._logging.set_logs(recompiles=True)  # a recompile inside the timed steps shows up in the log
    rows, profiles = [], []
    if args.cases:
        grid = [(m, seq, rc, prec) for m, rc, prec in (c.split(":", 2) for c in args.cases) for seq in args.seq]
    else:
        grid = [(m, seq, rc, prec) for m in args.models for seq in args.seq for rc in args.recompute for prec in args.precision]
    for model, seq, rc, prec in grid:
        held = torch.cuda.memory_allocated()
        try:
            if prec in HF_PRECISIONS:
                row = run_hf_case(model, seq, args.mbs, args.accum, rc, prec, args.steps)
            else:
                row = run_case(model, seq, args.mbs, args.accum, rc, prec, args.steps, args.profile, args.parallel)
        except Exception as e:  # one failing case (OOM, a recipe bug) must not lose the others
            what = "OOM" if isinstance(e, torch.OutOfMemoryError) else f"error: {type(e).__name__}: {str(e)[:120]}"
            row = {"model": model, "precision": prec, "seq": seq, "recompute": rc, "step_ms": what}
        # Each case's memory is freed before the next: outside the handler, whose exception's traceback holds a failed
        # case's frames (its trainer, whose reference cycles only a collection frees) until the handler ends;
        # torch._dynamo.reset also frees the CUDA graphs' pools (compile_mode=reduce-overhead).
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
        left = (torch.cuda.memory_allocated() - held) / 2**30
        if left > 0.25:  # the next case would start with less memory and report a higher peak
            row["left_allocated_GiB"] = left
        prof = row.pop("profile", None)
        if prof:
            profiles.append({"case": f"{model} {prec} s{seq} {rc}", **{k: f"{100 * v:.1f}%" for k, v in prof.items()}})
        rows.append(row)
        print(row, flush=True)
    sections = [f"parallel: {args.parallel}, {int(os.environ.get('WORLD_SIZE', '1'))} rank(s); TFLOP/s and MFU per GPU",
                markdown_table(rows)]
    if BESIDE:
        sections.insert(0, f"beside: one of {BESIDE[1]} processes, one per GPU, whose timed steps ran at once (no "
                           "communication between them)")
    ratios = []
    for row in rows:
        if row.get("precision", "").partition("+")[0] in ("bf16", *HF_PRECISIONS) or not isinstance(row.get("step_ms"), float):
            continue
        base = bf16_base(row, rows)
        if base:
            ceiling = base.get("fp8_ceiling")
            speed = base["step_ms"] / row["step_ms"]
            ratios.append({"model": row["model"], "seq": row["seq"], "recompute": row["recompute"], "precision": row["precision"],
                           "bf16 base": base["precision"],
                           "speedup vs bf16": speed, "Amdahl ceiling": ceiling if ceiling else "",
                           "% of ceiling": 100 * speed / ceiling if ceiling else "",
                           "memory vs bf16": row["peak_reserved_GiB"] / base["peak_reserved_GiB"]})
    if ratios:
        sections.append("FP8 vs BF16, same run:\n\n" + markdown_table(ratios))
    peers = [{"model": r["model"], "seq": r["seq"], "recompute": r["recompute"], "infir precision": r["precision"],
              "HF peer": h["precision"], "tokens/s vs peer": r["tokens/s"] / h["tokens/s"]}
             for r in rows if r.get("precision") not in HF_PRECISIONS and isinstance(r.get("step_ms"), float)
             for h in rows if h.get("precision") in HF_PRECISIONS and isinstance(h.get("step_ms"), float)
             and (h["model"], h["seq"]) == (r["model"], r["seq"])]
    if peers:
        sections.append("infir vs the HF transformers peers (bench/hf_peer.py), same run:\n\n" + markdown_table(peers))
    if profiles:
        cols = ["case"] + sorted({k for r in profiles for k in r if k != "case"})
        sections.append("GPU time by kernel class (one step):\n\n" + markdown_table(profiles, cols))
    emit("Training step, infir trainer (megatron-core GPTModel, torch attention kernels)", sections,
         args.out if reporting else None)
    from infir.train import dist as distributed

    distributed.shutdown()


if __name__ == "__main__":
    main()
