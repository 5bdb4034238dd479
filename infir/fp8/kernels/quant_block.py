"""Triton quantizer with one scale per 128x128 tile (InfiR2's weights).

dgrad's W^T is the result's QTensor.t(): a 128x128 block of W is one of W^T, so only the bytes move
(dispatch.transpose_q does it with kernels/transpose.py), in backward, freed after the dgrad GEMM; no
second FP8 copy of a weight is kept. This kernel once wrote W^T itself from the transposed tile; on
an H100 that store left parts of W^T holding stale allocator bytes, so FP8 dgrads came out NaN
(Triton's CPU interpreter was exact). No kernel here transposes a boolean mask tile since (mask_t).

Reference: quantize.quantize_block_ref, bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernel_launch import Launch, grid1d
from ..policy import kernel_policy
from ..quantize import WEIGHT_BLOCK, QTensor
from .autotune import ENTRIES, best, pick
from .triton_fp8 import abs_nan_inf, check_device, consts, inv_scale, q8, quot_safe, scale_from_amax


@triton.jit
def _quant_block_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm,
    FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr,
):
    pid = tl.program_id(0)
    n_kb = tl.cdiv(K, 128)
    pid_m = pid // n_kb
    pid_k = pid % n_kb
    rm = pid_m * 128 + tl.arange(0, 128)
    rk = pid_k * 128 + tl.arange(0, 128)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.max(abs_nan_inf(x), axis=1), axis=0)
    s = scale_from_amax(amax, FMAX, UE8M0)
    if DIV == 2:
        ok = quot_safe(s) == 1
    else:
        ok = True
    q = q8(x, s, inv_scale(s, UE8M0), ok, FMAX, OUT_DTYPE, DIV)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
    tl.store(s_ptr + pid, s)


def _tuned_runner(x2, scale_format, fmt):
    first = pick("block", None)
    cands = [first] + [{"num_warps": w} for w in (4, 8, 16) if w != first["num_warps"]]
    return best(lambda c: _runner(x2, scale_format, fmt, c), cands, x2)


def _runner(x2, scale_format, fmt, cfg):
    (fmax, ue, out, div), dt = consts(fmt, scale_format)
    soft = kernel_policy().interpret
    M, K = x2.shape
    dev = x2.device
    n_mb, n_kb = triton.cdiv(M, WEIGHT_BLOCK), triton.cdiv(K, WEIGHT_BLOCK)
    launch = Launch(_quant_block_kernel, grid1d(n_mb * n_kb), cfg["num_warps"])
    tail = (M, K, x2.stride(0), fmax, ue, out, div)

    def run(x):
        q = torch.empty((M, K), dtype=dt, device=dev)
        s = torch.empty((n_mb, n_kb), dtype=torch.float32, device=dev)
        launch(dev.index, x, q.view(torch.uint8) if soft else q, s, *tail)
        return QTensor(q, s, "block", scale_format, fmt)
    return run


def quantize_block_triton(x2, scale_format="ue8m0", fmt="e4m3") -> QTensor:
    """128x128 blocks of a 2-D x2. dgrad's W^T is the result's .t() (see the module doc)."""
    key = ("block", x2.shape, x2.stride(), x2.dtype, x2.device, x2.data_ptr() & 15 == 0, scale_format, fmt)
    run = ENTRIES.get(key)
    if run is None:
        check_device(x2)
        run = ENTRIES[key] = _tuned_runner(x2, scale_format, fmt)
    return run(x2)
