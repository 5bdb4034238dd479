"""Triton GEMM for MOSS two-level operands (seed 002, Figure 3b), C = A @ B^T.

A [M, K] two-level (E8M0 local scale per 32 along K, FP32 global per row); B [N, K] either
per-tensor (MOSS weights: an artificial local scale of 1) or two-level too (wgrad: dY^T x X^T).
The power-of-two local scales are applied to each 32-deep partial product in the main loop (the
FP32 accumulator takes one multiply-add per 32 MACs); the FP32 globals go to the epilogue.
Hopper has no MX tensor-core path, so the local scales cost CUDA-core work here that a Blackwell
MXFP8 GEMM would do in hardware: measured 345-430 TFLOP/s on an H100 at Qwen2.5 shapes, against
~1000-1250 for the folded operands on cuBLAS row-wise scaled_mm (quantize.fold_two_level), which
is why the moss recipe runs folded and this kernel stays the exact twin.
Reference twin: gemm.emulated_gemm (dequantize + matmul).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_fp8 import check_device, exp2i


@triton.jit
def _two_level_gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_code_ptr, a_g_ptr, b_code_ptr, b_g_ptr,
    M, N, K, n_groups,
    B_TWO_LEVEL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    n_pid_m = tl.cdiv(M, BM)
    n_pid_n = tl.cdiv(N, BN)
    width = GROUP_M * n_pid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(n_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    m_ok = rm < M
    n_ok = rn < N
    a_rows = a_ptr + rm[:, None].to(tl.int64) * K
    b_cols = b_ptr + rn[None, :].to(tl.int64) * K
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        for j in tl.static_range(BK // 32):
            rk = k0 + j * 32 + tl.arange(0, 32)
            k_ok = rk < K
            a = tl.load(a_rows + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_cols + rk[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            part = tl.dot(a, b)
            g = k0 // 32 + j
            g_ok = (tl.zeros_like(rm) + g) < n_groups
            ca = tl.load(a_code_ptr + rm.to(tl.int64) * n_groups + g, mask=m_ok & g_ok, other=127).to(tl.int32)
            f = exp2i(ca - 127)[:, None]
            if B_TWO_LEVEL:
                cb = tl.load(b_code_ptr + rn.to(tl.int64) * n_groups + g, mask=n_ok & ((tl.zeros_like(rn) + g) < n_groups), other=127).to(tl.int32)
                f = f * exp2i(cb - 127)[None, :]
            acc += part * f
    ga = tl.load(a_g_ptr + rm, mask=m_ok, other=1.0)
    if B_TWO_LEVEL:
        gb = tl.load(b_g_ptr + rn, mask=n_ok, other=1.0)[None, :]
    else:
        gb = tl.load(b_g_ptr)
    out = acc * ga[:, None] * gb
    tl.store(c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], out.to(c_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def two_level_gemm_triton(a, b, out_dtype=torch.bfloat16, block_m=128, block_n=128, block_k=128,
                          group_m=8, num_warps=8, num_stages=3) -> torch.Tensor:
    """a: two_level QTensor [M, K]; b: two_level or tensor QTensor [N, K]. Returns [M, N]."""
    check_device(a.data)
    if a.granularity != "two_level" or b.granularity not in ("two_level", "tensor"):
        raise ValueError(f"two-level GEMM takes (two_level, two_level|tensor) operands, got "
                         f"({a.granularity}, {b.granularity})")
    M, K = a.data.shape
    N = b.data.shape[0]
    n_groups = a.local_exp.shape[-1]
    c = torch.empty((M, N), dtype=out_dtype, device=a.data.device)
    b_two = b.granularity == "two_level"
    b_code = b.local_exp if b_two else a.local_exp  # unused when B is per-tensor
    b_g = b.global_scale if b_two else b.scale.reshape(1)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _two_level_gemm_kernel[grid](a.data, b.data, c, a.local_exp, a.global_scale, b_code, b_g, M, N, K, n_groups,
                                 B_TWO_LEVEL=b_two, BM=block_m, BN=block_n, BK=block_k, GROUP_M=group_m,
                                 num_warps=num_warps, num_stages=num_stages)
    return c
