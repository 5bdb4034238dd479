"""Triton quantization kernels, bit-identical to infir/fp8/quantize.py (the reference).

One HBM pass per tensor wherever the scaling unit allows it:
- `_quant_rows_kernel`: 1x128 scales along K (X in fprop, dY in dgrad), at HBM speed.
- `_quant_cols_t_kernel`: 128x1 scales along M, written transposed (X^T and dY^T for wgrad, whose
  contraction runs over the tokens).
- `_quant_token_both_kernel`: both layouts in one launch, either fused (one read of X) or split;
  autotuned, because a first fused version ran at only 31% of copy bandwidth on an H100 (its
  128x128 FP8 transpose dominated) while the rows kernel alone ran at 87%.
- `_quant_block_kernel`: one 128x128 scale per tile; writes W and, optionally, W^T's bytes.
- `_quant_two_level_kernel`: MOSS rows: pass 1 finds the row amax, pass 2 (re-read mostly from
  L2) writes data, per-32 effective scales, E8M0 codes and the row's global scale, or (fold)
  the row-scaled GEMM operand of quantize.fold_two_level directly.
- `_amax_kernel` + `_quant_scalar_kernel`: per-tensor (just-in-time, or a given scale for MOSS
  autoscale); the quantize pass also records the true amax it saw, so autoscale can count
  mispredictions without another pass.

Bit-exactness rules shared with the reference: x / scale with IEEE round-to-nearest division
(div_rn, not the approximate `/`), NaN counted as +inf in every amax, saturating RNE cast, exponent
of amax/fmax read from the bits (no log2). The reference is exact on the CPU; torch's CUDA
division is not always bit-identical to it for FP32 scales, so GPU tests compare with CPU results.
In Triton's interpreter the FP8 cast is done in integer arithmetic (_fp8_bits_rne), because the
interpreter's own float8 cast rounds differently; a GPU test holds the two casts together.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..formats import get_format
from ..quantize import MICRO_GROUP, TOKEN_BLOCK, WEIGHT_BLOCK, QTensor

_TL_DTYPE = {"e4m3": tl.float8e4nv, "e5m2": tl.float8e5}


@triton.jit
def _ceil_log2(x):
    bits = x.to(tl.int32, bitcast=True)
    biased = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    normal = biased - 127 + (mant != 0).to(tl.int32)
    sub = tl.where(mant > (1 << 22), -126, -127)
    e = tl.where(biased == 0, sub, normal)
    return tl.minimum(tl.maximum(e, -127), 127)


@triton.jit
def _exp2i(e):
    bits = tl.where(e >= -126, (e + 127) << 23, 1 << 22)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _abs_nan_inf(x):
    a = tl.abs(x.to(tl.float32))
    return tl.where(a != a, float("inf"), a)


@triton.jit
def _scale_from_amax(amax, FMAX: tl.constexpr, UE8M0: tl.constexpr):
    s = tl.math.div_rn(amax, tl.full(amax.shape, FMAX, tl.float32))
    if UE8M0:
        out = _exp2i(_ceil_log2(s))
    else:
        out = s
    out = tl.where(s == 0, 1.0, out)
    return tl.where(amax == float("inf"), float("nan"), out)


@triton.jit
def _fp8_bits_rne(v, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """Round-to-nearest-even float32 -> FP8 bit pattern (uint8), for |v| <= fmax or NaN.

    Integer twin of the hardware cvt.rn.satfinite: Triton's interpreter (CPU tests) rounds FP8
    casts differently from the GPU and from torch, so interpreted kernels use this instead.
    """
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    shift: tl.constexpr = 23 - MBITS
    lsb = (a >> shift) & 1
    normal = ((a + ((1 << (shift - 1)) - 1) + lsb) >> shift) - ((127 - BIAS) << MBITS)
    # below the smallest normal: a multiple of 2^(1 - BIAS - MBITS), rounded to even by the 2^23 trick
    f = tl.abs(v) * (2.0 ** (BIAS - 1 + MBITS))
    sub = (f + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
    code = tl.where(a >= ((128 - BIAS) << 23), normal, sub)
    code = tl.where(v != v, 0x7F, code) | sign
    return code.to(tl.uint8)


@triton.jit
def _fp8_bits_to_f32(c, MBITS: tl.constexpr, BIAS: tl.constexpr):
    c = c.to(tl.int32)
    e = (c >> MBITS) & ((1 << (7 - MBITS)) - 1)
    m = c & ((1 << MBITS) - 1)
    mag = tl.where(e == 0, m.to(tl.float32), (m + (1 << MBITS)).to(tl.float32))
    v = mag * _exp2i(tl.maximum(e, 1) - BIAS - MBITS)
    return tl.where((c & 0x80) != 0, -v, v)


@triton.jit
def _fp8_round(q, FMAX: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """q (already saturated) rounded to the FP8 grid, as float32 (NaN stays NaN)."""
    if OUT_DTYPE == tl.uint8:
        if FMAX == 448.0:
            r = _fp8_bits_to_f32(_fp8_bits_rne(q, 3, 7), 3, 7)
        else:
            r = _fp8_bits_to_f32(_fp8_bits_rne(q, 2, 15), 2, 15)
        r = tl.where(q != q, q, r)
    else:
        r = q.to(OUT_DTYPE).to(tl.float32)
    return r


@triton.jit
def _to_fp8(x, scale, FMAX: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """x / scale, saturated, as FP8 (hardware cast) or as its uint8 bits (SOFT: interpreter)."""
    return _cast_fp8(tl.math.div_rn(x, scale), FMAX, OUT_DTYPE)


@triton.jit
def _cast_fp8(q, FMAX: tl.constexpr, OUT_DTYPE: tl.constexpr):
    q = tl.clamp(q, -FMAX, FMAX, propagate_nan=tl.PropagateNan.ALL)
    if OUT_DTYPE == tl.uint8:
        if FMAX == 448.0:
            r = _fp8_bits_rne(q, 3, 7)
        else:
            r = _fp8_bits_rne(q, 2, 15)
    else:
        r = q.to(OUT_DTYPE)
    return r


@triton.jit
def _quant_rows_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm,
    BM: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    """1x128 along K: q [M, K]; scale (M, K/128) stored outer-dim-major (address m + kb * M),
    the layout scaled_mm reads, so no copy is needed before the GEMM."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rk = pid_k * 128 + tl.arange(0, 128)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    s = _scale_from_amax(tl.max(_abs_nan_inf(x), axis=1), FMAX, UE8M0)
    q = _to_fp8(x, s[:, None], FMAX, OUT_DTYPE)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
    tl.store(s_ptr + pid_k.to(tl.int64) * M + rm, s, mask=rm < M)


@triton.jit
def _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, pid_m, pid_k,
                 BN: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """128x1 along M, written transposed: q^T [K, M]; scale (K, M/128) outer-dim-major
    (address k + mb * K). A [128, BN] tile is read along K and stored along M."""
    rm = pid_m * 128 + tl.arange(0, 128)
    rk = pid_k * BN + tl.arange(0, BN)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    st = _scale_from_amax(tl.max(_abs_nan_inf(x), axis=0), FMAX, UE8M0)
    qt = tl.trans(_to_fp8(x, st[None, :], FMAX, OUT_DTYPE))
    tl.store(qt_ptr + rk[:, None].to(tl.int64) * M + rm[None, :], qt, mask=tl.trans(mask))
    tl.store(st_ptr + pid_m.to(tl.int64) * K + rk, st, mask=rk < K)


@triton.jit
def _quant_cols_t_kernel(x_ptr, qt_ptr, st_ptr, M, K, stride_xm,
                         BN: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr):
    _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, tl.program_id(0), tl.program_id(1), BN, FMAX, UE8M0, OUT_DTYPE)


@triton.jit
def _quant_token_both_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, stride_xm,
    FUSED: tl.constexpr, TRANS_IN: tl.constexpr, BN: tl.constexpr, BM_ROWS: tl.constexpr,
    FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    """X along K *and* X^T along M in one launch. FUSED: one read of a 128x128 tile serves both
    (the transpose of the bf16 input (TRANS_IN) or of the FP8 output goes through shared memory);
    else the grid's first programs do rows and the rest do the transposing columns, reading X
    twice. Autotuning picks whichever is faster on the device; both give the same bits."""
    pid = tl.program_id(0)
    n_kb = tl.cdiv(K, 128)
    if FUSED:
        pid_m = pid // n_kb
        pid_k = pid % n_kb
        rm = pid_m * 128 + tl.arange(0, 128)
        rk = pid_k * 128 + tl.arange(0, 128)
        mask = (rm[:, None] < M) & (rk[None, :] < K)
        xb = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0)
        x = xb.to(tl.float32)
        s = _scale_from_amax(tl.max(_abs_nan_inf(x), axis=1), FMAX, UE8M0)
        tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], _to_fp8(x, s[:, None], FMAX, OUT_DTYPE), mask=mask)
        tl.store(s_ptr + pid_k.to(tl.int64) * M + rm, s, mask=rm < M)
        if TRANS_IN:
            xt = tl.trans(xb).to(tl.float32)  # [128 (K), 128 (M)]
            st = _scale_from_amax(tl.max(_abs_nan_inf(xt), axis=1), FMAX, UE8M0)
            qt = _to_fp8(xt, st[:, None], FMAX, OUT_DTYPE)
        else:
            st = _scale_from_amax(tl.max(_abs_nan_inf(x), axis=0), FMAX, UE8M0)
            qt = tl.trans(_to_fp8(x, st[None, :], FMAX, OUT_DTYPE))
        tl.store(qt_ptr + rk[:, None].to(tl.int64) * M + rm[None, :], qt, mask=tl.trans(mask))
        tl.store(st_ptr + pid_m.to(tl.int64) * K + rk, st, mask=rk < K)
    else:
        n_row_progs = tl.cdiv(M, BM_ROWS) * n_kb
        if pid < n_row_progs:
            pid_m = pid // n_kb
            pid_k = pid % n_kb
            rm = pid_m * BM_ROWS + tl.arange(0, BM_ROWS)
            rk = pid_k * 128 + tl.arange(0, 128)
            mask = (rm[:, None] < M) & (rk[None, :] < K)
            x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
            s = _scale_from_amax(tl.max(_abs_nan_inf(x), axis=1), FMAX, UE8M0)
            tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], _to_fp8(x, s[:, None], FMAX, OUT_DTYPE), mask=mask)
            tl.store(s_ptr + pid_k.to(tl.int64) * M + rm, s, mask=rm < M)
        else:
            c = pid - n_row_progs
            n_kt = tl.cdiv(K, BN)
            _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, c // n_kt, c % n_kt, BN, FMAX, UE8M0, OUT_DTYPE)


@triton.jit
def _quant_block_kernel(
    x_ptr, q_ptr, qt_ptr, s_ptr, M, K, stride_xm, n_kb,
    WRITE_T: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = pid_m * 128 + tl.arange(0, 128)
    rk = pid_k * 128 + tl.arange(0, 128)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.max(_abs_nan_inf(x), axis=1), axis=0)
    s = _scale_from_amax(amax, FMAX, UE8M0)
    q = _to_fp8(x, s, FMAX, OUT_DTYPE)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
    if WRITE_T:
        tl.store(qt_ptr + rk[:, None].to(tl.int64) * M + rm[None, :], tl.trans(q), mask=tl.trans(mask))
    tl.store(s_ptr + pid_m * n_kb + pid_k, s)


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
        row_amax = tl.maximum(row_amax, tl.max(_abs_nan_inf(x), axis=1))
    s = _scale_from_amax(row_amax, FMAX, UE8M0)
    finite = s == s
    tl.store(g_ptr + rm, s, mask=row_ok)
    for k0 in range(0, K, BK):  # pass 2: Eq. 2-3 per group of 32, then quantize
        rk = k0 + tl.arange(0, BK)
        mask = row_ok[:, None] & (rk[None, :] < K)
        x = tl.load(x_rows + rk[None, :], mask=mask, other=0.0).to(tl.float32)
        x3 = tl.reshape(x, (BM, G, 32))
        gamax = tl.max(_abs_nan_inf(x3), axis=2)
        s_i = tl.math.div_rn(gamax, tl.full(gamax.shape, FMAX, tl.float32))
        ratio = tl.math.div_rn(s_i, tl.broadcast_to(s[:, None], (BM, G)))
        e = tl.where(gamax == 0, 0, _ceil_log2(ratio))
        eff = tl.where(finite[:, None], s[:, None] * _exp2i(e), float("nan"))
        code = tl.where(finite[:, None], e + 127, 255).to(tl.uint8)
        if FOLD:  # Q * ss rounded to FP8 again: the row-scaled operand of fold_two_level()
            q = tl.math.div_rn(x3, eff[:, :, None])
            q = _fp8_round(tl.clamp(q, -FMAX, FMAX, propagate_nan=tl.PropagateNan.ALL), FMAX, OUT_DTYPE)
            q = _cast_fp8(q * _exp2i(e)[:, :, None], FMAX, OUT_DTYPE)
        else:
            q = _to_fp8(x3, eff[:, :, None], FMAX, OUT_DTYPE)
        tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], tl.reshape(q, (BM, BK)), mask=mask)
        if not FOLD:
            rg = k0 // 32 + tl.arange(0, G)
            gmask = row_ok[:, None] & (rg[None, :] < n_groups)
            goff = rm[:, None].to(tl.int64) * n_groups + rg[None, :]
            tl.store(s_ptr + goff, eff, mask=gmask)
            tl.store(code_ptr + goff, code, mask=gmask)


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.atomic_max(amax_ptr, tl.max(_abs_nan_inf(x), axis=0))


@triton.jit
def _quant_scalar_kernel(
    x_ptr, q_ptr, qt_ptr, s_ptr, amax_ptr, seen_ptr, M, K, stride_xm,
    SCALE_FROM_AMAX: tl.constexpr, WRITE_T: tl.constexpr, RECORD_AMAX: tl.constexpr,
    BM: tl.constexpr, BK: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    if SCALE_FROM_AMAX:  # just in time: the amax pass ran before this one
        s = _scale_from_amax(tl.load(amax_ptr), FMAX, UE8M0)
        if (pid_m == 0) & (pid_k == 0):
            tl.store(s_ptr, s)
    else:  # a given scale (MOSS autoscale)
        s = tl.load(s_ptr)
    rm = pid_m * BM + tl.arange(0, BM)
    rk = pid_k * BK + tl.arange(0, BK)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    q = _to_fp8(x, s, FMAX, OUT_DTYPE)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
    if WRITE_T:
        tl.store(qt_ptr + rk[:, None].to(tl.int64) * M + rm[None, :], tl.trans(q), mask=tl.trans(mask))
    if RECORD_AMAX:
        tl.atomic_max(seen_ptr, tl.max(tl.max(_abs_nan_inf(x), axis=1), axis=0))


# ----------------------------------------------------------------------------- host wrappers


def _check_device(x: torch.Tensor) -> None:
    if x.dim() == 2 and x.stride(-1) != 1:
        raise ValueError(f"Triton FP8 kernels need unit stride along the last dim, got strides {x.stride()}; "
                         "pass x.contiguous()")
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "Triton FP8 kernels got a CPU tensor: run them on CUDA, or set TRITON_INTERPRET=1 before "
            "importing infir.fp8.kernels to run them in Triton's interpreter (tests do this)"
        )


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


def soft_cast_default() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# Kernels write FP8 through a uint8 view when the software cast is on; the bytes are the same.
SOFT_CAST = soft_cast_default()


def _consts(fmt: str, scale_format: str):
    f = get_format(fmt)
    out = tl.uint8 if SOFT_CAST else _TL_DTYPE[fmt]
    return dict(FMAX=f.max, UE8M0=scale_format == "ue8m0", OUT_DTYPE=out), f.dtype


def _v(t: torch.Tensor) -> torch.Tensor:
    """The pointer a kernel writes FP8 through: the tensor itself or its uint8 view."""
    return t.view(torch.uint8) if SOFT_CAST and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


_BOTH_CONFIGS = (
    [{"FUSED": True, "TRANS_IN": t, "BN": 128, "BM_ROWS": 32, "num_warps": w} for t in (True, False) for w in (4, 8, 16)]
    + [{"FUSED": False, "TRANS_IN": False, "BN": bn, "BM_ROWS": 32, "num_warps": w} for bn in (32, 64, 128) for w in (4, 8)]
)
_COLS_CONFIGS = [{"BN": bn, "num_warps": w} for bn in (32, 64, 128) for w in (4, 8)]
_tuned = {}


def _launch(kernel, name, configs, fixed, grid, config=None, **kw):
    """Run `kernel` with `config`, or autotuned over `configs` on a GPU (the transposes go
    through shared memory and their best shape differs by size), or with `fixed` in the
    interpreter. Every config computes the same bits; tests run them one by one."""
    if config is None and SOFT_CAST:
        config = fixed
    if config is not None:
        cfg = dict(config)
        nw = cfg.pop("num_warps", 4)
        return kernel[grid(cfg)](**kw, **cfg, num_warps=nw)
    if name not in _tuned:
        tc = [triton.Config({k: v for k, v in c.items() if k != "num_warps"}, num_warps=c["num_warps"]) for c in configs]
        _tuned[name] = triton.autotune(configs=tc, key=["M", "K"])(kernel)
    return _tuned[name][grid](**kw)


def quantize_token_triton(x2, scale_format="ue8m0", fmt="e4m3", rows=True, cols=False, block_m=32, config=None):
    """1x128 along K (rows) and/or 128x1 along M written transposed (cols). Returns (q, q_t).

    Scales come back as outer-dim-major views, the layout torch's blockwise scaled_mm takes.
    config: force one kernel configuration (tests); default autotunes on a GPU.
    """
    _check_device(x2)
    c, dt = _consts(fmt, scale_format)
    M, K = x2.shape
    n_kb, n_mb = triton.cdiv(K, TOKEN_BLOCK), triton.cdiv(M, TOKEN_BLOCK)
    q = torch.empty((M, K) if rows else (1,), dtype=dt, device=x2.device)
    s = torch.empty((n_kb, M) if rows else (1,), dtype=torch.float32, device=x2.device)
    qt = torch.empty((K, M) if cols else (1,), dtype=dt, device=x2.device)
    st = torch.empty((n_mb, K) if cols else (1,), dtype=torch.float32, device=x2.device)
    common = dict(x_ptr=x2, M=M, K=K, stride_xm=x2.stride(0), **c)
    if rows and cols:
        def grid(meta):
            if meta["FUSED"]:
                return (n_mb * n_kb,)
            return (triton.cdiv(M, meta["BM_ROWS"]) * n_kb + n_mb * triton.cdiv(K, meta["BN"]),)
        _launch(_quant_token_both_kernel, "both", _BOTH_CONFIGS, _BOTH_CONFIGS[-4], grid, config,
                q_ptr=_v(q), s_ptr=s, qt_ptr=_v(qt), st_ptr=st, **common)
    elif rows:
        _quant_rows_kernel[(triton.cdiv(M, block_m), n_kb)](x2, _v(q), s, M, K, x2.stride(0), BM=block_m, num_warps=4, **c)
    elif cols:
        grid = lambda meta: (n_mb, triton.cdiv(K, meta["BN"]))
        _launch(_quant_cols_t_kernel, "cols", _COLS_CONFIGS, _COLS_CONFIGS[2], grid, config,
                qt_ptr=_v(qt), st_ptr=st, **common)
    out = QTensor(q, s.t(), "token", scale_format, fmt) if rows else None
    out_t = QTensor(qt, st.t(), "token", scale_format, fmt) if cols else None
    return out, out_t


def quantize_block_triton(x2, scale_format="ue8m0", fmt="e4m3", transpose=False):
    """128x128 blocks; with transpose=True also W^T's bytes (same values, scales transposed)."""
    _check_device(x2)
    c, dt = _consts(fmt, scale_format)
    M, K = x2.shape
    n_mb, n_kb = triton.cdiv(M, WEIGHT_BLOCK), triton.cdiv(K, WEIGHT_BLOCK)
    q = torch.empty((M, K), dtype=dt, device=x2.device)
    qt = torch.empty((K, M) if transpose else (1,), dtype=dt, device=x2.device)
    s = torch.empty((n_mb, n_kb), dtype=torch.float32, device=x2.device)
    _quant_block_kernel[(n_mb, n_kb)](x2, _v(q), _v(qt), s, M, K, x2.stride(0), n_kb, WRITE_T=transpose, num_warps=8, **c)
    out = QTensor(q, s, "block", scale_format, fmt)
    out_t = QTensor(qt, s.t().contiguous(), "block", scale_format, fmt) if transpose else None
    return out, out_t


def quantize_two_level_triton(x2, scale_format="fp32", fmt="e4m3", fold=False, block_m=2, block_k=2048, num_warps=8):
    """MOSS two-level rows; fold=True returns fold_two_level() of it directly (granularity "row")."""
    _check_device(x2)
    c, dt = _consts(fmt, scale_format)
    M, K = x2.shape
    n_groups = triton.cdiv(K, MICRO_GROUP)
    block_k = min(block_k, max(32, triton.next_power_of_2(K)))
    q = torch.empty((M, K), dtype=dt, device=x2.device)
    s = torch.empty((1,) if fold else (M, n_groups), dtype=torch.float32, device=x2.device)
    g = torch.empty((M,), dtype=torch.float32, device=x2.device)
    code = torch.empty((1,) if fold else (M, n_groups), dtype=torch.uint8, device=x2.device)
    _quant_two_level_kernel[(triton.cdiv(M, block_m),)](x2, _v(q), s, g, code, M, K, x2.stride(0), n_groups,
                                                        BM=block_m, BK=block_k, FOLD=fold, num_warps=num_warps, **c)
    if fold:
        return QTensor(q, g.unsqueeze(-1), "row", scale_format, fmt)
    return QTensor(q, s, "two_level", scale_format, fmt, global_scale=g, local_exp=code)


def amax_triton(x: torch.Tensor, block: int = 8192) -> torch.Tensor:
    """max |x| as a float32 0-dim tensor (NaN counted as inf)."""
    xc = x.contiguous().reshape(-1)
    _check_device(xc)
    out = torch.zeros((), dtype=torch.float32, device=x.device)
    _amax_kernel[(max(1, triton.cdiv(xc.numel(), block)),)](xc, out, xc.numel(), BLOCK=block, num_warps=8)
    return out


def quantize_tensor_triton(x2, scale_format="ue8m0", fmt="e4m3", scale=None, transpose=False, record_amax=None):
    """Per-tensor. scale=None: just-in-time (amax pass, then quantize pass). Given scale: one pass.

    record_amax: a float32 0-dim tensor that receives max(itself, amax of x), fused in the pass.
    Returns (q, q_t) where q_t is x^T's bytes with the same scale (or None).
    """
    _check_device(x2)
    c, dt = _consts(fmt, scale_format)
    M, K = x2.shape
    from_amax = scale is None
    amax = amax_triton(x2) if from_amax else torch.empty((), dtype=torch.float32, device=x2.device)
    s = torch.empty((), dtype=torch.float32, device=x2.device) if from_amax else scale.float().reshape(()).contiguous()
    q = torch.empty((M, K), dtype=dt, device=x2.device)
    qt = torch.empty((K, M) if transpose else (1,), dtype=dt, device=x2.device)
    seen = record_amax if record_amax is not None else amax
    bm, bk = 64, 128
    _quant_scalar_kernel[(triton.cdiv(M, bm), triton.cdiv(K, bk))](
        x2, _v(q), _v(qt), s, amax, seen, M, K, x2.stride(0), SCALE_FROM_AMAX=from_amax, WRITE_T=transpose,
        RECORD_AMAX=record_amax is not None, BM=bm, BK=bk, num_warps=4, **c)
    out = QTensor(q, s, "tensor", scale_format, fmt)
    out_t = QTensor(qt, s, "tensor", scale_format, fmt) if transpose else None
    return out, out_t


def quantize_triton(x: torch.Tensor, granularity: str, scale_format: str = "ue8m0", fmt: str = "e4m3") -> QTensor:
    """The public quantize() on the Triton path: same arguments, same QTensor, same bits."""
    if granularity == "block" and x.dim() != 2:
        raise ValueError(f"the Triton block quantizer takes 2-D tensors, got shape {tuple(x.shape)}; "
                         "use impl='reference' for batched blocks")
    lead = x.shape[:-1]
    x2 = _as_2d(x)
    if granularity == "token":
        q, _ = quantize_token_triton(x2, scale_format, fmt)
    elif granularity == "block":
        q, _ = quantize_block_triton(x2, scale_format, fmt)
    elif granularity == "two_level":
        q = quantize_two_level_triton(x2, scale_format, fmt)
    elif granularity == "tensor":
        q, _ = quantize_tensor_triton(x2.reshape(1, -1) if x2.dim() != 2 else x2, scale_format, fmt)
    else:
        raise ValueError(f"unknown granularity {granularity!r}")
    if granularity == "block":
        return q
    q.data = q.data.reshape(x.shape)
    if granularity in ("token", "two_level"):
        q.scale = q.scale.reshape(*lead, q.scale.shape[-1])
    if granularity == "two_level":
        q.global_scale = q.global_scale.reshape(lead)
        q.local_exp = q.local_exp.reshape(*lead, q.local_exp.shape[-1])
    return q
