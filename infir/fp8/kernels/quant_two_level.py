"""Triton quantizer of MOSS two-level rows (quantize.quantize_two_level_ref), and of their folded GEMM
operand (quantize.fold_two_level) in the same pass; quant_two_level.cu is its CUDA C++ twin.

`_quant_two_level_kernel`: pass 1 finds the row amax, pass 2 (re-read mostly from L2) writes data,
per-32 effective scales, E8M0 codes and the row's global scale, or (FOLD) the row-scaled GEMM operand
directly. Its quotient is div_rn: on an H100 the guarded fast quotient of the other quantizers
(triton_fp8.quot) ran slower inside this kernel's K loop.

References: quantize.quantize_two_level_ref and fold_two_level, bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernel_launch import Launch, grid1d
from ..formats import get_format
from ..policy import kernel_policy
from ..quantize import MICRO_GROUP, QTensor
from .autotune import ENTRIES, best
from .cuda_lib import cuda_fn, cuda_two_level_ok
from .triton_fp8 import abs_nan_inf, cast_fp8, ceil_log2, check_device, consts, exp2i, fp8_round, scale_from_amax


@triton.jit
def _quant_two_level_kernel(
    x_ptr, q_ptr, s_ptr, g_ptr, code_ptr, M, K, stride_xm, n_groups,
    BM: tl.constexpr, BK: tl.constexpr, FOLD: tl.constexpr,
    FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    G: tl.constexpr = BK // 32
    pid = tl.program_id(0)
    rm = pid * BM + tl.arange(0, BM)
    row_ok = rm < M
    x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
    row_amax = tl.zeros([BM], dtype=tl.float32)
    for k0 in range(0, K, BK):  # pass 1: s = max_i s_i = (row amax) / fmax (RN division is monotone)
        rk = k0 + tl.arange(0, BK)
        mask = row_ok[:, None] & (rk[None, :] < K)
        x = tl.load(x_rows + rk[None, :], mask=mask, other=0.0)
        row_amax = tl.maximum(row_amax, tl.max(abs_nan_inf(x), axis=1))
    s = scale_from_amax(row_amax, FMAX, UE8M0)
    finite = s == s
    tl.store(g_ptr + rm, s, mask=row_ok)
    for k0 in range(0, K, BK):  # pass 2: Eq. 2-3 per group of 32, then quantize
        rk = k0 + tl.arange(0, BK)
        mask = row_ok[:, None] & (rk[None, :] < K)
        x = tl.load(x_rows + rk[None, :], mask=mask, other=0.0).to(tl.float32)
        x3 = tl.reshape(x, (BM, G, 32))
        gamax = tl.max(abs_nan_inf(x3), axis=2)
        s_i = tl.math.div_rn(gamax, tl.full(gamax.shape, FMAX, tl.float32))
        ratio = tl.math.div_rn(s_i, tl.broadcast_to(s[:, None], (BM, G)))
        e = tl.where(gamax == 0, 0, ceil_log2(ratio))
        eff = tl.where(finite[:, None], s[:, None] * exp2i(e), float("nan"))
        code = tl.where(finite[:, None], e + 127, 255).to(tl.uint8)
        q = tl.math.div_rn(x3, eff[:, :, None])
        if FOLD:  # Q * ss rounded to FP8 again: the row-scaled operand of fold_two_level()
            q = fp8_round(tl.clamp(q, -FMAX, FMAX, propagate_nan=tl.PropagateNan.ALL), FMAX, OUT_DTYPE)
            q = cast_fp8(q * exp2i(e)[:, :, None], FMAX, OUT_DTYPE)
        else:
            q = cast_fp8(q, FMAX, OUT_DTYPE)
        tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], tl.reshape(q, (BM, BK)), mask=mask)
        if not FOLD:
            rg = k0 // 32 + tl.arange(0, G)
            gmask = row_ok[:, None] & (rg[None, :] < n_groups)
            goff = rm[:, None].to(tl.int64) * n_groups + rg[None, :]
            tl.store(s_ptr + goff, eff, mask=gmask)
            tl.store(code_ptr + goff, code, mask=gmask)


def _two_level_runner(x2, scale_format, fmt, fold, write):
    """run(x) of a two-level kernel: allocates the outputs, calls write(x, q, s, g, code) and wraps
    them (fold: q and the row scales g only; s and code are 1-element dummies)."""
    M, K = x2.shape
    dt, dev, f32, u8 = get_format(fmt).dtype, x2.device, torch.float32, torch.uint8
    n_groups = triton.cdiv(K, MICRO_GROUP)
    if fold:
        dummy_s = torch.empty((1,), dtype=f32, device=dev)
        dummy_c = torch.empty((1,), dtype=u8, device=dev)

        def run(x):
            q, g = torch.empty((M, K), dtype=dt, device=dev), torch.empty((M, 1), dtype=f32, device=dev)
            write(x, q, dummy_s, g, dummy_c)
            return QTensor(q, g, "row", scale_format, fmt)
    else:
        def run(x):
            q = torch.empty((M, K), dtype=dt, device=dev)
            s = torch.empty((M, n_groups), dtype=f32, device=dev)
            g = torch.empty((M,), dtype=f32, device=dev)
            code = torch.empty((M, n_groups), dtype=u8, device=dev)
            write(x, q, s, g, code)
            return QTensor(q, s, "two_level", scale_format, fmt, global_scale=g, local_exp=code)
    return run


def _triton_runner(x2, scale_format, fmt, fold, block_m, block_k, num_warps):
    (fmax, ue, out, _), _ = consts(fmt, scale_format)
    soft = kernel_policy().interpret
    M, K = x2.shape
    idx = x2.device.index
    block_k = min(block_k, max(32, triton.next_power_of_2(K)))
    launch = Launch(_quant_two_level_kernel, grid1d(triton.cdiv(M, block_m)), num_warps)
    tail = (M, K, x2.stride(0), triton.cdiv(K, MICRO_GROUP), block_m, block_k, fold, fmax, ue, out)

    def write(x, q, s, g, code):
        launch(idx, x, q.view(torch.uint8) if soft else q, s, g, code, *tail)
    return _two_level_runner(x2, scale_format, fmt, fold, write)


def _cuda_runner(x2, scale_format, fmt, fold):
    fn = cuda_fn("infir_quant_two_level", x2.device)
    M, K = x2.shape
    ld, idx = x2.stride(0), x2.device.index
    opts = (int(scale_format == "ue8m0"), int(fmt == "e5m2"), int(fold))
    stream = torch._C._cuda_getCurrentRawStream

    def write(x, q, s, g, code):
        err = fn(x.data_ptr(), ld, q.data_ptr(), s.data_ptr(), g.data_ptr(), code.data_ptr(), M, K, *opts, stream(idx))
        if err:
            raise RuntimeError(f"quant_two_level.cu launch failed with cudaError {err} at x {tuple(x.shape)}")
    return _two_level_runner(x2, scale_format, fmt, fold, write)


def quantize_two_level_triton(x2, scale_format="fp32", fmt="e4m3", fold=False, block_m=2, block_k=2048, num_warps=8,
                              impl="auto"):
    """MOSS two-level rows; fold=True returns fold_two_level() of it directly (granularity "row").

    impl: "triton" (this configuration of _quant_two_level_kernel), "cuda" (quant_two_level.cu;
    Triton where it does not take x2, see cuda_two_level_ok) or "auto" (the faster of the two on
    the first call for a shape)."""
    key = ("two_level", x2.shape, x2.stride(), x2.dtype, x2.device, x2.data_ptr() & 15 == 0,
           scale_format, fmt, fold, block_m, block_k, num_warps, impl)
    run = ENTRIES.get(key)
    if run is None:
        check_device(x2)
        cands = [] if impl == "cuda" else ["triton"]
        if impl != "triton" and cuda_two_level_ok(x2):
            cands.append("cuda")
        build = lambda c: (_cuda_runner(x2, scale_format, fmt, fold) if c == "cuda" else
                           _triton_runner(x2, scale_format, fmt, fold, block_m, block_k, num_warps))
        run = ENTRIES[key] = best(build, cands or ["triton"], x2)
    return run(x2)
