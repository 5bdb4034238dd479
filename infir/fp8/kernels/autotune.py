"""Which configuration each Triton quantizer runs with: the candidates, the default, and the first-call
timing that picks among them; and the cache of set-up launches, keyed per input signature.

Host side: the FP8 linear layers call the quantizers several times per layer and step, and a
training step is host-bound if each call costs tens of microseconds. So each wrapper keys ENTRIES
on (shape, strides, dtype, device, alignment, options); the first call picks the configuration
(best), compiles through Triton's JIT and keeps the compiled kernel's launcher; later calls allocate
the outputs and launch it directly with positional arguments (no argument binding, specialization,
autotuner or dict building). `bench/quant.py --host` measures the cost per call.

"both" and "cols" list every candidate (tests run each; all give the same bits). On a GPU the first
call for a shape times the candidates of its kernel (best) and keeps the fastest; DEFAULT_CFG is
tried first, and is the one used without autotuning (policy.autotune off, the interpreter).
"""
from __future__ import annotations

import logging

import torch

from ..policy import kernel_policy

log = logging.getLogger(__name__)
ENTRIES: dict = {}


def clear_launch_cache() -> None:
    """Forget every cached configuration and launcher (benches change configurations)."""
    ENTRIES.clear()


BOTH_CONFIGS = (
    [{"FUSED": True, "TRANS_IN": t, "GROUPED": False, "BN": 128, "BM_ROWS": 32, "num_warps": w}
     for t in (True, False) for w in (4, 8, 16)]
    + [{"FUSED": False, "TRANS_IN": False, "GROUPED": g, "BN": bn, "BM_ROWS": 32, "num_warps": w}
       for g in (False, True) for bn in (32, 64, 128) for w in (4, 8)]
    # the CUDA C++ kernel (quant_both.cu), where it builds and the shape suits it (cuda_both_ok);
    # elsewhere this entry runs the default Triton configuration
    + [{"CUDA": True, "LOADS": n} for n in (4, 8)]
)
COLS_CONFIGS = [{"BN": bn, "num_warps": w} for bn in (32, 64, 128) for w in (4, 8)]
# The fastest Triton configurations at 16384x8192 bf16 on an H100 (bench/quant.py --sweep): the split
# both-layouts kernel (X read twice) beat the fused 128x128 tile, which stays compute/latency-bound.
TRITON_BOTH = {"FUSED": False, "TRANS_IN": False, "GROUPED": False, "BN": 64, "BM_ROWS": 32, "num_warps": 4}
DEFAULT_CFG = {
    "both": TRITON_BOTH,
    "cols": {"BN": 64, "num_warps": 4},
    "rows": {"num_warps": 4},
    "block": {"num_warps": 8},
    "two_level": {},
    "scalar": {"BM": 64, "BK": 128, "num_warps": 4},
    "amax": {"BLOCK": 4096, "num_warps": 8, "per_sm": 4},
}
INTERP_CFG = {"both": DEFAULT_CFG["both"], "cols": COLS_CONFIGS[2]}
_sm_count: dict = {}


def n_sm(device) -> int:
    if device.type != "cuda":
        return 2
    n = _sm_count.get(device.index)
    if n is None:
        n = _sm_count[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def pick(name: str, config):
    if config is not None:
        return dict(config)
    if kernel_policy().interpret and name in INTERP_CFG:
        return dict(INTERP_CFG[name])
    return dict(DEFAULT_CFG[name])


# A GPU busy-wait (torch's own test helper) that lets the host queue the timed runs ahead of the GPU.
_spin = getattr(torch.cuda, "_sleep", None)
_SPIN_CYCLES = 2_000_000  # about a millisecond at H100 clocks: longer than the host takes to queue ten runs


def best(build, candidates, x):
    """The fastest of `candidates` (configs) for input x: build(cfg) -> run(x), timed with CUDA
    events over 10 runs queued behind a GPU spin (best of 3, after 2 warm-ups). Behind the
    spin, because timed one by one or even back to back the events also caught the host's work per
    call (output allocation, the launch itself: bench/quant.py --host)
    whenever it exceeded the kernel, which decided for the cheaper launch rather than the faster
    kernel at small shapes; in training the host runs ahead and the kernel time is what the step
    pays. Once per cache entry, on the first call: the kernels have no side effects beyond their
    fresh outputs, so trial launches are harmless. A candidate that fails is skipped (warmed).
    Without timing (policy.autotune off, the interpreter, a CPU tensor) the first candidate runs."""
    policy = kernel_policy()
    if policy.interpret or not policy.autotune or len(candidates) < 2 or not x.is_cuda:
        return build(candidates[0])
    fastest, best_ms, best_cfg = None, float("inf"), None
    for cfg in candidates:
        run = warmed(build, cfg, x)
        if run is None:
            continue
        ms = float("inf")
        for _ in range(3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if _spin is not None:
                _spin(_SPIN_CYCLES)
            a.record()
            for _ in range(10):
                run(x)
            b.record()
            b.synchronize()
            ms = min(ms, a.elapsed_time(b) / 10)
        if ms < best_ms:
            fastest, best_ms, best_cfg = run, ms, cfg
    if fastest is None:
        raise RuntimeError(f"every FP8 quantizer candidate failed on a {tuple(x.shape)} {x.dtype} input (see the warnings above)")
    log.debug("FP8 quantizer for %s %s: %s, %.4f ms, fastest of %d", tuple(x.shape), x.dtype, best_cfg, best_ms,
              len(candidates))
    return fastest


def warmed(build, cfg, x):
    """build(cfg)'s run, after two runs on x; None, with a warning, where building or running it
    raises. A CUDA C++ library can build here and still fail to set up or launch (a driver older
    than the nvcc that built it, say): the Triton candidates must then carry on, not the run stop."""
    try:
        run = build(cfg)
        for _ in range(2):
            run(x)
    except RuntimeError as e:
        log.warning("infir: FP8 quantizer candidate %s failed on a %s input and is skipped: %s", cfg, tuple(x.shape), e)
        return None
    return run
