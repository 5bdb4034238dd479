"""Triton quantizers with one scale per tensor (LLMQ's just-in-time per-tensor scaling, and MOSS
weights with a given scale), and the amax pass they share.

`_amax_partial_kernel` + `_quant_scalar_kernel`: just in time, per-program partial maxima, reduced
again by every quantize program, so no zero-filled buffer or atomics are needed; or a given scale
(MOSS autoscale) in one pass. The quantize pass can also record the true amax it saw, so autoscale
can count mispredictions without another pass.

Reference: quantize.quantize_tensor_ref (and formats.amax_with_nan_as_inf), bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernel_launch import Launch, grid1d
from ..policy import kernel_policy
from ..quantize import QTensor
from .autotune import DEFAULT_CFG, ENTRIES, n_sm
from .transpose import transpose_2d
from .triton_fp8 import abs_nan_inf, check_device, consts, inv_scale, q8, quot_safe, scale_from_amax


@triton.jit
def _amax_partial_kernel(x_ptr, part_ptr, N, BLOCK: tl.constexpr):
    """part[pid] = max |x| over the blocks pid, pid + P, ... (NaN counted as inf); P = the grid."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for b in range(pid, tl.cdiv(N, BLOCK), nprog):
        offs = tl.cast(b, tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
        acc = tl.maximum(acc, abs_nan_inf(x))
    tl.store(part_ptr + pid, tl.max(acc, axis=0))


@triton.jit
def _quant_scalar_kernel(
    x_ptr, q_ptr, s_ptr, part_ptr, seen_ptr, M, K, stride_xm, n_part,
    SCALE_FROM_AMAX: tl.constexpr, RECORD_AMAX: tl.constexpr,
    BM: tl.constexpr, BK: tl.constexpr, NP: tl.constexpr,
    FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr,
):
    pid = tl.program_id(0)
    n_kt = tl.cdiv(K, BK)
    pid_m = pid // n_kt
    pid_k = pid % n_kt
    if SCALE_FROM_AMAX:  # just in time: every program reduces the amax pass's partial maxima (L2-resident)
        rp = tl.arange(0, NP)
        s = scale_from_amax(tl.max(tl.load(part_ptr + rp, mask=rp < n_part, other=0.0), axis=0), FMAX, UE8M0)
        if pid == 0:
            tl.store(s_ptr, s)
    else:  # a given scale (MOSS autoscale)
        s = tl.load(s_ptr)
    if DIV == 2:
        ok = quot_safe(s) == 1
    else:
        ok = True
    rm = pid_m * BM + tl.arange(0, BM)
    rk = pid_k * BK + tl.arange(0, BK)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    q = q8(x, s, inv_scale(s, UE8M0), ok, FMAX, OUT_DTYPE, DIV)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
    if RECORD_AMAX:
        tl.atomic_max(seen_ptr, tl.max(tl.max(abs_nan_inf(x), axis=1), axis=0))


def _amax_entry(n: int, x: torch.Tensor):
    """Launch of the partial-amax pass over n contiguous elements: (launch, number of partials)."""
    cfg = DEFAULT_CFG["amax"]
    block = cfg["BLOCK"] if not kernel_policy().interpret else 1024
    n_part = max(1, min(triton.cdiv(n, block), cfg["per_sm"] * n_sm(x.device)))
    return Launch(_amax_partial_kernel, grid1d(n_part), cfg["num_warps"]), n_part, block


def amax_triton(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a float32 0-dim tensor (NaN counted as inf)."""
    xc = x.contiguous().reshape(-1)
    key = ("amax", xc.shape, xc.dtype, xc.device, xc.data_ptr() & 15 == 0)
    ent = ENTRIES.get(key)
    if ent is None:
        check_device(xc)
        ent = ENTRIES[key] = _amax_entry(xc.numel(), xc)
    launch, n_part, blk = ent
    part = torch.empty((n_part,), dtype=torch.float32, device=xc.device)
    launch(xc.device.index, xc, part, xc.numel(), blk)
    return part.amax() if n_part > 1 else part.reshape(())


def _tensor_entry(x2, scale_format, fmt, given, transpose, record):
    (fmax, ue, out, div), dt = consts(fmt, scale_format, given_scale=given)
    soft = kernel_policy().interpret
    M, K = x2.shape
    dev = x2.device
    idx = dev.index
    f32 = torch.float32
    u8 = torch.uint8
    cfg = DEFAULT_CFG["scalar"]
    bm, bk = cfg["BM"], cfg["BK"]
    launch = Launch(_quant_scalar_kernel, grid1d(triton.cdiv(M, bm) * triton.cdiv(K, bk)), cfg["num_warps"])
    contiguous = x2.stride(0) == K or M == 1
    if not given:
        amax_launch, n_part, blk = _amax_entry(M * K, x2)
    else:
        n_part, blk = 1, 1
    np2 = triton.next_power_of_2(n_part)
    tail = (M, K, x2.stride(0), n_part, not given, record, bm, bk, np2, fmax, ue, out, div)
    dummy_f = torch.empty((1,), dtype=f32, device=dev)

    def run(x, scale, seen):
        q = torch.empty((M, K), dtype=dt, device=dev)
        if given:
            s, part = scale, dummy_f
        else:
            s = torch.empty((), dtype=f32, device=dev)
            part = torch.empty((n_part,), dtype=f32, device=dev)
            amax_launch(idx, x if contiguous else x.contiguous(), part, M * K, blk)
        launch(idx, x, q.view(u8) if soft else q, s, part, seen, *tail)
        out_q = QTensor(q, s, "tensor", scale_format, fmt)
        return out_q, (out_q.t(transpose_2d) if transpose else None)  # X^T of a per-tensor activation
    run.dummy_f = dummy_f
    return run


def quantize_tensor_triton(x2, scale_format="ue8m0", fmt="e4m3", scale=None, transpose=False, record_amax=None):
    """Per-tensor. scale=None: just-in-time (amax pass, then quantize pass). Given scale: one pass.

    record_amax: a float32 0-dim tensor that receives max(itself, amax of x), fused in the pass.
    Returns (q, q_t) where q_t is x^T's bytes with the same scale (or None).
    """
    given = scale is not None
    if given and not (scale.dtype == torch.float32 and scale.dim() == 0):
        scale = scale.float().reshape(()).contiguous()
    record = record_amax is not None
    key = ("tensor", x2.shape, x2.stride(), x2.dtype, x2.device, x2.data_ptr() & 15 == 0,
           scale_format, fmt, given, transpose, record)
    run = ENTRIES.get(key)
    if run is None:
        check_device(x2)
        run = ENTRIES[key] = _tensor_entry(x2, scale_format, fmt, given, transpose, record)
    return run(x2, scale, record_amax if record else run.dummy_f)
