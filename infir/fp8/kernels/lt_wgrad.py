"""The wgrad GEMM (1x128 x 1x128 scales along the tokens) through cuBLASLt: kernels/lt_wgrad.cu.

Picks, once per shape, the fastest of cuBLASLt's unsplit algorithms (all give the same bits), and
accumulates into an FP32 buffer in place (megatron's main_grad) instead of writing a new tensor to
be added. `lt_wgrad` returns None wherever the library did not build or the operands are not its
case; callers then keep torch's scaled_mm.
"""
from __future__ import annotations

import ctypes
import logging

import torch

from . import cuda_build

log = logging.getLogger(__name__)
_FP8 = torch.float8_e4m3fn
# (device index, Mo, No, K, A's row stride, fp32 out, accumulate) -> (plan id, fastest algorithm or None),
# or None where cuBLASLt has no plan (adding C runs other kernels, so accumulate picks its own)
_PLANS: dict = {}
_LIB: dict = {}  # device index -> library or None


def _lib(device: torch.device):
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _LIB:
        lib = cuda_build.load("lt_wgrad", device, cublaslt=True)
        if lib is not None:
            lib.infir_lt_wgrad_plan.restype = lib.infir_lt_wgrad_algos.restype = lib.infir_lt_wgrad.restype = ctypes.c_int
        _LIB[idx] = lib
    return _LIB[idx]


def _run(lib, plan: int, algo: int, a, sa, b, sb, out, beta: float) -> int:
    p = ctypes.c_void_p
    return lib.infir_lt_wgrad(plan, algo, p(a.data_ptr()), p(b.data_ptr()), p(sa.data_ptr()), p(sb.data_ptr()),
                              p(out.data_ptr()), ctypes.c_float(beta), p(torch.cuda.current_stream(a.device).cuda_stream))


def _fastest(lib, plan: int, a, sa, b, sb, out, beta: float, reps: int = 3) -> int:
    """The plan's fastest algorithm on these operands with this beta (cuBLASLt runs another kernel
    when it adds C), timed into a scratch copy of out; an algorithm that fails to launch never wins."""
    scratch = torch.empty_like(out)
    times = []
    for algo in range(lib.infir_lt_wgrad_algos(plan)):
        if _run(lib, plan, algo, a, sa, b, sb, scratch, beta):
            times.append(float("inf"))
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            _run(lib, plan, algo, a, sa, b, sb, scratch, beta)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return min(range(len(times)), key=times.__getitem__)


# the heuristic's algorithms assume operands 256-byte aligned (cuBLASLt's default preference)
_ALIGN = 256


def fits(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> bool:
    """E4M3 operands [Mo, K] and [No, K], K-contiguous, with outer-dim-major 1x128 scales. A's rows may
    be strided (columns of a wider matrix), aligned as cuBLASLt's algorithms assume; B is contiguous."""
    if a.dtype != _FP8 or b.dtype != _FP8 or a.dim() != 2 or b.dim() != 2 or not b.is_contiguous():
        return False
    (mo, k), no = a.shape, b.shape[0]
    if not a.is_contiguous() and (a.stride(1) != 1 or a.stride(0) < k or a.stride(0) % 16
                                  or a.data_ptr() % _ALIGN):
        return False
    outer_major = lambda s, rows: s.shape == (rows, k // 128) and s.stride(0) == 1 and (k == 128 or s.stride(1) == rows)
    return k == b.shape[1] and k % 128 == 0 and mo % 16 == 0 and no % 16 == 0 and outer_major(sa, mo) and outer_major(sb, no)


def _plan(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, accumulate: bool = False):
    """(library, plan key, (plan id, chosen algorithm or None)) for a [Mo, K] @ b [No, K]^T; the entry
    is None where the library did not build or cuBLASLt offers no unsplit algorithm."""
    lib = _lib(a.device)
    lda = a.stride(0) if a.shape[0] > 1 else a.shape[1]
    key = (a.device.index, a.shape[0], b.shape[0], a.shape[1], lda, out_dtype == torch.float32, accumulate)
    if lib is None:
        return None, key, None
    entry = _PLANS.get(key, ())
    if entry == ():
        plan = lib.infir_lt_wgrad_plan(a.shape[0], b.shape[0], a.shape[1], lda, int(out_dtype == torch.float32),
                                       ctypes.c_void_p(a.data_ptr()))
        entry = None if plan < 0 else (plan, None)
        if plan < 0:
            log.info("infir: cuBLASLt has no unsplit algorithm for wgrad %s (status %d); using scaled_mm", key, -plan)
        _PLANS[key] = entry
    return lib, key, entry


def lt_wgrad(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, out_dtype: torch.dtype = torch.float32,
             accumulate: torch.Tensor | None = None, algo: int | None = None) -> torch.Tensor | None:
    """a [Mo, K] (its rows strided or not: `fits`) @ b [No, K]^T in out_dtype (FP32 or BF16), or added in
    place into `accumulate` (FP32 [Mo, No], returned); None where this path does not apply (see module doc).

    algo: force one of the plan's algorithms (tests); default: the fastest, timed on the first call
    of each shape outside CUDA-graph capture (inside one, the heuristic's first, not remembered).
    """
    if not a.is_cuda or not fits(a, sa, b, sb):
        return None
    if accumulate is not None:
        if accumulate.dtype != torch.float32 or accumulate.shape != (a.shape[0], b.shape[0]) or not accumulate.is_contiguous():
            return None
        out_dtype = torch.float32
    elif out_dtype not in (torch.float32, torch.bfloat16):
        return None
    lib, key, entry = _plan(a, b, out_dtype, accumulate is not None)
    if entry is None:
        return None
    plan, best = entry
    out = accumulate if accumulate is not None else torch.empty((a.shape[0], b.shape[0]), dtype=out_dtype, device=a.device)
    beta = 1.0 if accumulate is not None else 0.0
    if algo is None:
        if best is None and not torch.cuda.is_current_stream_capturing():
            best = _fastest(lib, plan, a, sa, b, sb, out, beta)
            _PLANS[key] = (plan, best)
        algo = 0 if best is None else best
    status = _run(lib, plan, algo, a, sa, b, sb, out, beta)
    if status:
        raise RuntimeError(f"cuBLASLt wgrad GEMM failed (cublasStatus {status}) at {key}; set INFIR_CUDA_KERNELS=0 "
                           "to use torch's scaled_mm instead")
    return out


def algo_count(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> int:
    """How many algorithms the plan for these operands holds (0 where there is none): for tests."""
    lib, _, entry = _plan(a, b, out_dtype)
    return 0 if entry is None else lib.infir_lt_wgrad_algos(entry[0])
