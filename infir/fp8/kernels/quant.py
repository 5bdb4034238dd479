"""Triton quantization kernels, bit-identical to infir/fp8/quantize.py (the reference).

One HBM pass per tensor wherever the scaling unit allows it:
- `_quant_rows_kernel`: 1x128 scales along K (X in fprop, dY in dgrad).
- `_quant_cols_t_kernel`: 128x1 scales along M, written transposed (X^T and dY^T for wgrad, whose
  contraction runs over the tokens).
- `_quant_token_both_kernel`: both layouts in one launch, fused (one read of a 128x128 tile serves
  both; the transpose of the bf16 input or of the FP8 output goes through shared memory) or split
  (rows programs + transposing column programs, X read twice; grouped: the two kinds of programs
  interleaved per 128x128 region, so that the second read may come from L2). On a GPU with nvcc,
  quant_both.cu (CUDA C++, 85-88% of copy bandwidth where these reach 60-71%) is one more
  candidate of the autotune; it won at every shape of the 1.5B and 7B steps profiled on 2026-11-24.
- `_quant_block_kernel`: one 128x128 scale per tile. W^T for dgrad is W's bytes transposed by torch
  (see _W_T_BY_TORCH: the in-kernel transposed store gave NaN dgrads on an H100).
- `_quant_two_level_kernel`: MOSS rows: pass 1 finds the row amax, pass 2 (re-read mostly from
  L2) writes data, per-32 effective scales, E8M0 codes and the row's global scale, or (fold)
  the row-scaled GEMM operand of quantize.fold_two_level directly.
- `_amax_partial_kernel` + `_quant_scalar_kernel`: per-tensor (just-in-time: per-program partial
  maxima, reduced again by every quantize program, so no zero-filled buffer or atomics are needed;
  or a given scale for MOSS autoscale); the quantize pass can also record the true amax it saw, so
  autoscale can count mispredictions without another pass.

Bit-exactness rules shared with the reference: x / scale correctly rounded (IEEE
round-to-nearest), NaN counted as +inf in every amax, saturating RNE cast, exponent of amax/fmax
read from the bits (no log2). The quotient is computed one of three ways (`DIV`), all equal to
IEEE division bit for bit: 0 `div_rn`; 1 for power-of-two scales (UE8M0), x * (1/s), exact since
1/s is a power of two too; 2 for FP32 scales on a GPU, x * RN(1/s) refined by two Markstein
corrections (fma), exact while s is in [2^-80, 2^80] (a tile with a scale outside falls back to
div_rn). On an H100 the fast quotients took the rows, cols, block and per-tensor kernels to 89-97%
of copy bandwidth (from 70-89%); the two-level kernel keeps div_rn (its guarded fast path was
slower). The fused both-layouts tile (128x128) stays compute/latency-bound (49%); the split
variant (X read twice) is the Triton default at 60%. The reference is exact on the CPU; torch's CUDA division is not always bit-identical
to it for FP32 scales, so GPU tests compare with CPU results. In Triton's interpreter the FP8 cast
is done in integer arithmetic (_fp8_bits_rne), because the interpreter's own float8 cast rounds
differently, and FP32 scales use div_rn (older interpreters round fma twice); GPU tests hold the
casts and quotients together.

Host side: the FP8 linear layers call these wrappers several times per layer and step, and a
training step is host-bound if each call costs tens of microseconds. So each wrapper keys a cache
on (shape, strides, dtype, device, alignment, options); the first call picks the configuration,
compiles through Triton's JIT and keeps the compiled kernel's launcher; later calls allocate the
outputs and launch it directly with positional arguments (no argument binding, specialization,
autotuner or dict building). `bench/quant.py --host` measures the cost per call.
"""
from __future__ import annotations

import ctypes
import logging
import os

import torch
import triton
import triton.language as tl

from ...kernel_launch import Launch, grid1d
from . import cuda_build
from ..formats import get_format
from ..quantize import MICRO_GROUP, TOKEN_BLOCK, WEIGHT_BLOCK, QTensor

log = logging.getLogger(__name__)
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




_LO_SAFE = tl.constexpr(8.271806125530277e-25)  # 2^-80
_HI_SAFE = tl.constexpr(1.2089258196146292e24)  # 2^80


@triton.jit
def _recip(s):
    return tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)


@triton.jit
def _inv_scale(s, UE8M0: tl.constexpr):
    """1/s, exactly, for a scale from _scale_from_amax. UE8M0: s = 2^e (e in [-127, 127]), 1, or
    NaN, so 1/s = 2^-e is built from the exponent bits instead of a division."""
    if UE8M0:
        e = ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        # 2^-127 is the subnormal 1 << 22: biased exponent 0 also gives e = -127
        r = tl.where(s != s, s, _exp2i(-e))
    else:
        r = _recip(s)
    return r


@triton.jit
def _safe(s):
    """1 where a fast quotient by s is exact (see _quot), else 0."""
    return (((s >= _LO_SAFE) & (s <= _HI_SAFE)) | (s != s)).to(tl.int32)


@triton.jit
def _quot(x, s, y, DIV: tl.constexpr):
    """x / s rounded to nearest, y = RN(1/s) (unused for DIV 0).

    DIV 1: s is a power of two (or 1, or NaN), so y is exact and x * y is the rounded quotient.
    DIV 2: q = RN(x * y), then two Markstein corrections q += (x - s*q) * y, each remainder exact
    through fma; the second starts from a faithful q, so it returns RN(x / s) (Markstein 1990), as
    long as s and x/s stay clear of under/overflow: callers guarantee s in [2^-80, 2^80] (or NaN)
    and |x/s| <= fmax * (1 + 2^-23). A zero quotient takes x's sign bit afterwards, as IEEE division
    gives it (s > 0): compiled, the chain above gave +0 for x = -0 on an H100 (tests/fp8/test_kernels.py).
    """
    if DIV == 1:
        q = x * y
    elif DIV == 2:
        sb = tl.broadcast_to(s, x.shape)
        yb = tl.broadcast_to(y, x.shape)
        q = x * yb
        q = tl.fma(-tl.fma(q, sb, -x), yb, q)
        q = tl.fma(-tl.fma(q, sb, -x), yb, q)
        sign = (x.to(tl.uint32, bitcast=True) & 0x80000000).to(tl.float32, bitcast=True)
        q = tl.where(q == 0, sign, q)
    else:
        q = tl.math.div_rn(x, s)
    return q


@triton.jit
def _q8(x, s, y, ok, FMAX: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr):
    """x / s as FP8 (or its uint8 bits); ok (scalar): the fast quotient is exact for this tile."""
    if DIV == 0:
        q = _quot(x, s, y, 0)
    else:
        if ok:
            q = _quot(x, s, y, DIV)
        else:
            q = _quot(x, s, y, 0)
    return _cast_fp8(q, FMAX, OUT_DTYPE)


@triton.jit
def _ok1(s, DIV: tl.constexpr):
    """Tile guard for a 1-D vector of scales: only DIV 2 needs one (UE8M0 scales are in range)."""
    if DIV == 2:
        r = tl.min(_safe(s), axis=0) == 1
    else:
        r = True
    return r


@triton.jit
def _mask_t(rm, rk, M, K):
    # The bounds mask of a transposed [K-tile, M-tile] store, built in that orientation rather than
    # by tl.trans(mask): the weight kernels' transposed store with a transposed mask went wrong on
    # an H100 (see _W_T_BY_TORCH), so no kernel here transposes a boolean tile.
    return (rk[:, None] < K) & (rm[None, :] < M)


@triton.jit
def _quant_rows_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm,
    BM: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr,
):
    """1x128 along K: q [M, K]; scale (M, K/128) stored outer-dim-major (address m + kb * M),
    the layout scaled_mm reads, so no copy is needed before the GEMM. Programs walk K fastest."""
    pid = tl.program_id(0)
    n_kb = tl.cdiv(K, 128)
    _rows_tile(x_ptr, q_ptr, s_ptr, M, K, stride_xm, pid // n_kb, pid % n_kb, BM, FMAX, UE8M0, OUT_DTYPE, DIV)


@triton.jit
def _rows_tile(x_ptr, q_ptr, s_ptr, M, K, stride_xm, pid_m, pid_k,
               BM: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
               DIV: tl.constexpr):
    """A [BM, 128] tile of X along K: q rows and their 1x128 scales."""
    rm = pid_m * BM + tl.arange(0, BM)
    rk = pid_k * 128 + tl.arange(0, 128)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    s = _scale_from_amax(tl.max(_abs_nan_inf(x), axis=1), FMAX, UE8M0)
    q = _q8(x, s[:, None], _inv_scale(s, UE8M0)[:, None], _ok1(s, DIV), FMAX, OUT_DTYPE, DIV)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
    tl.store(s_ptr + pid_k.to(tl.int64) * M + rm, s, mask=rm < M)


@triton.jit
def _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, pid_m, pid_k,
                 BN: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
                 DIV: tl.constexpr):
    """128x1 along M, written transposed: q^T [K, M]; scale (K, M/128) outer-dim-major
    (address k + mb * K). A [128, BN] tile is read along K and stored along M."""
    rm = pid_m * 128 + tl.arange(0, 128)
    rk = pid_k * BN + tl.arange(0, BN)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    st = _scale_from_amax(tl.max(_abs_nan_inf(x), axis=0), FMAX, UE8M0)
    qt = tl.trans(_q8(x, st[None, :], _inv_scale(st, UE8M0)[None, :], _ok1(st, DIV), FMAX, OUT_DTYPE, DIV))
    tl.store(qt_ptr + rk[:, None].to(tl.int64) * M + rm[None, :], qt, mask=_mask_t(rm, rk, M, K))
    tl.store(st_ptr + pid_m.to(tl.int64) * K + rk, st, mask=rk < K)


@triton.jit
def _quant_cols_t_kernel(x_ptr, qt_ptr, st_ptr, M, K, stride_xm,
                         BN: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
                         DIV: tl.constexpr):
    pid = tl.program_id(0)
    n_kt = tl.cdiv(K, BN)
    _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, pid // n_kt, pid % n_kt, BN, FMAX, UE8M0, OUT_DTYPE, DIV)


@triton.jit
def _quant_token_both_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, stride_xm,
    FUSED: tl.constexpr, TRANS_IN: tl.constexpr, GROUPED: tl.constexpr, BN: tl.constexpr, BM_ROWS: tl.constexpr,
    FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr,
):
    """X along K *and* X^T along M in one launch. FUSED: one read of a 128x128 tile serves both
    (the transpose of the bf16 input (TRANS_IN) or of the FP8 output goes through shared memory);
    else the grid's first programs do rows and the rest do the transposing columns, reading X
    twice, or (GROUPED) both kinds interleaved region by region. All configurations give the same
    bits."""
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
        q = _q8(x, s[:, None], _inv_scale(s, UE8M0)[:, None], _ok1(s, DIV), FMAX, OUT_DTYPE, DIV)
        tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
        tl.store(s_ptr + pid_k.to(tl.int64) * M + rm, s, mask=rm < M)
        if TRANS_IN:
            xt = tl.trans(xb).to(tl.float32)  # [128 (K), 128 (M)]
            st = _scale_from_amax(tl.max(_abs_nan_inf(xt), axis=1), FMAX, UE8M0)
            qt = _q8(xt, st[:, None], _inv_scale(st, UE8M0)[:, None], _ok1(st, DIV), FMAX, OUT_DTYPE, DIV)
        else:
            st = _scale_from_amax(tl.max(_abs_nan_inf(x), axis=0), FMAX, UE8M0)
            qt = tl.trans(_q8(x, st[None, :], _inv_scale(st, UE8M0)[None, :], _ok1(st, DIV), FMAX, OUT_DTYPE, DIV))
        tl.store(qt_ptr + rk[:, None].to(tl.int64) * M + rm[None, :], qt, mask=_mask_t(rm, rk, M, K))
        tl.store(st_ptr + pid_m.to(tl.int64) * K + rk, st, mask=rk < K)
    elif GROUPED:
        # Split, but the row and column programs of each 128x128 region of X run next to each
        # other, so that X's second read can come from L2 rather than HBM.
        rows_per = 128 // BM_ROWS
        per = rows_per + 128 // BN
        region = pid // per
        j = pid % per
        if j < rows_per:
            _rows_tile(x_ptr, q_ptr, s_ptr, M, K, stride_xm, (region // n_kb) * rows_per + j, region % n_kb,
                       BM_ROWS, FMAX, UE8M0, OUT_DTYPE, DIV)
        else:
            _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, region // n_kb,
                         (region % n_kb) * (128 // BN) + j - rows_per, BN, FMAX, UE8M0, OUT_DTYPE, DIV)
    else:
        n_row_progs = tl.cdiv(M, BM_ROWS) * n_kb
        if pid < n_row_progs:
            _rows_tile(x_ptr, q_ptr, s_ptr, M, K, stride_xm, pid // n_kb, pid % n_kb,
                       BM_ROWS, FMAX, UE8M0, OUT_DTYPE, DIV)
        else:
            c = pid - n_row_progs
            n_kt = tl.cdiv(K, BN)
            _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, c // n_kt, c % n_kt, BN, FMAX, UE8M0, OUT_DTYPE, DIV)


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
    amax = tl.max(tl.max(_abs_nan_inf(x), axis=1), axis=0)
    s = _scale_from_amax(amax, FMAX, UE8M0)
    if DIV == 2:
        ok = _safe(s) == 1
    else:
        ok = True
    q = _q8(x, s, _inv_scale(s, UE8M0), ok, FMAX, OUT_DTYPE, DIV)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
    tl.store(s_ptr + pid, s)


@triton.jit
def _quant_two_level_kernel(
    x_ptr, q_ptr, s_ptr, g_ptr, code_ptr, M, K, stride_xm, n_groups,
    BM: tl.constexpr, BK: tl.constexpr, FOLD: tl.constexpr,
    FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr,
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
        # eff = s * 2^e can leave the safe range (or underflow) for groups far below the row amax
        ok = tl.min(tl.min(_safe(eff), axis=1), axis=0) == 1
        if FOLD:  # Q * ss rounded to FP8 again: the row-scaled operand of fold_two_level()
            if DIV == 0:
                q = _quot(x3, eff[:, :, None], eff[:, :, None], 0)
            else:
                if ok:
                    q = _quot(x3, eff[:, :, None], _recip(eff)[:, :, None], DIV)
                else:
                    q = _quot(x3, eff[:, :, None], eff[:, :, None], 0)
            q = _fp8_round(tl.clamp(q, -FMAX, FMAX, propagate_nan=tl.PropagateNan.ALL), FMAX, OUT_DTYPE)
            q = _cast_fp8(q * _exp2i(e)[:, :, None], FMAX, OUT_DTYPE)
        else:
            q = _q8(x3, eff[:, :, None], _recip(eff)[:, :, None], ok, FMAX, OUT_DTYPE, DIV)
        tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], tl.reshape(q, (BM, BK)), mask=mask)
        if not FOLD:
            rg = k0 // 32 + tl.arange(0, G)
            gmask = row_ok[:, None] & (rg[None, :] < n_groups)
            goff = rm[:, None].to(tl.int64) * n_groups + rg[None, :]
            tl.store(s_ptr + goff, eff, mask=gmask)
            tl.store(code_ptr + goff, code, mask=gmask)


@triton.jit
def _amax_partial_kernel(x_ptr, part_ptr, N, BLOCK: tl.constexpr):
    """part[pid] = max |x| over the blocks pid, pid + P, ... (NaN counted as inf); P = the grid."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for b in range(pid, tl.cdiv(N, BLOCK), nprog):
        offs = tl.cast(b, tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
        acc = tl.maximum(acc, _abs_nan_inf(x))
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
        s = _scale_from_amax(tl.max(tl.load(part_ptr + rp, mask=rp < n_part, other=0.0), axis=0), FMAX, UE8M0)
        if pid == 0:
            tl.store(s_ptr, s)
    else:  # a given scale (MOSS autoscale)
        s = tl.load(s_ptr)
    if DIV == 2:
        ok = _safe(s) == 1
    else:
        ok = True
    rm = pid_m * BM + tl.arange(0, BM)
    rk = pid_k * BK + tl.arange(0, BK)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    q = _q8(x, s, _inv_scale(s, UE8M0), ok, FMAX, OUT_DTYPE, DIV)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
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
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# Quotient algorithm (see _quot); None: UE8M0 -> 1, FP32 -> 2 compiled / 0 interpreted. Benches may force 0.
DIV_OVERRIDE = None
# Per-tensor scales given by the caller can be anything (x/s may overflow): always div_rn.


def _consts(fmt: str, scale_format: str, given_scale: bool = False):
    f = get_format(fmt)
    out = tl.uint8 if SOFT_CAST else _TL_DTYPE[fmt]
    ue = scale_format == "ue8m0"
    if given_scale:
        div = 0
    elif DIV_OVERRIDE is not None:
        div = DIV_OVERRIDE
    else:
        div = 1 if ue else (0 if _INTERPRET else 2)
    return (f.max, ue, out, div), f.dtype


def _v(t: torch.Tensor) -> torch.Tensor:
    """The pointer a kernel writes FP8 through: the tensor itself or its uint8 view."""
    return t.view(torch.uint8) if SOFT_CAST and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


_ENTRIES: dict = {}


def clear_launch_cache() -> None:
    """Forget every cached configuration and launcher (benches change configurations)."""
    _ENTRIES.clear()


def _empty(shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)


def _key_of(x: torch.Tensor):
    return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15 == 0)


# Kernel configurations. "both" and "cols" list every candidate (tests run each; all give the
# same bits). On a GPU the first call for a shape times the candidates of its kernel (_best) and
# keeps the fastest; _DEFAULT_CFG is tried first, and is the one used without autotuning.
_BOTH_CONFIGS = (
    [{"FUSED": True, "TRANS_IN": t, "GROUPED": False, "BN": 128, "BM_ROWS": 32, "num_warps": w}
     for t in (True, False) for w in (4, 8, 16)]
    + [{"FUSED": False, "TRANS_IN": False, "GROUPED": g, "BN": bn, "BM_ROWS": 32, "num_warps": w}
       for g in (False, True) for bn in (32, 64, 128) for w in (4, 8)]
    # the CUDA C++ kernel (quant_both.cu), where it builds and the shape suits it (cuda_both_ok);
    # elsewhere this entry runs the default Triton configuration
    + [{"CUDA": True, "LOADS": n} for n in (4, 8)]
)
_COLS_CONFIGS = [{"BN": bn, "num_warps": w} for bn in (32, 64, 128) for w in (4, 8)]
# H100, 16384x8192 bf16 (bench/quant.py --sweep, 2026-11-23): split BN=64/4 warps 60% of copy
# bandwidth, the fused 128x128 tile at best 49%; cols BN=64/4 warps 89%; block 8 warps 76% (with W^T)
_TRITON_BOTH = {"FUSED": False, "TRANS_IN": False, "GROUPED": False, "BN": 64, "BM_ROWS": 32, "num_warps": 4}
_DEFAULT_CFG = {
    "both": _TRITON_BOTH,
    "cols": {"BN": 64, "num_warps": 4},
    "rows": {"num_warps": 4},
    "block": {"num_warps": 8},
    "two_level": {},
    "scalar": {"BM": 64, "BK": 128, "num_warps": 4},
    "amax": {"BLOCK": 4096, "num_warps": 8, "per_sm": 4},
}
_INTERP_CFG = {"both": _DEFAULT_CFG["both"], "cols": _COLS_CONFIGS[2]}
_sm_count: dict = {}


def _n_sm(device) -> int:
    if device.type != "cuda":
        return 2
    n = _sm_count.get(device.index)
    if n is None:
        n = _sm_count[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def _pick(name: str, config):
    if config is not None:
        return dict(config)
    if _INTERPRET and name in _INTERP_CFG:
        return dict(_INTERP_CFG[name])
    return dict(_DEFAULT_CFG[name])


# Set INFIR_FP8_AUTOTUNE=0 to skip the first-call timing and take _DEFAULT_CFG as is.
AUTOTUNE = os.environ.get("INFIR_FP8_AUTOTUNE", "1") != "0"
# A GPU busy-wait (torch's own test helper) that lets the host queue the timed runs ahead of the GPU.
_spin = getattr(torch.cuda, "_sleep", None)
_SPIN_CYCLES = 2_000_000  # ~1 ms at H100 clocks; ten runs take the host 0.2-0.3 ms to queue (bench/quant.py --host)


def _best(build, candidates, x):
    """The fastest of `candidates` (configs) for input x: build(cfg) -> run(x), timed with CUDA
    events over 10 runs queued behind a ~1 ms GPU spin (best of 3, after 2 warm-ups). Behind the
    spin, because timed one by one or even back to back the events also caught the host's work per
    call (output allocation, the launch itself: 19-32 us on an H100 host, bench/quant.py --host)
    whenever it exceeded the kernel, which decided for the cheaper launch rather than the faster
    kernel at small shapes; in training the host runs ahead and the kernel time is what the step
    pays. Once per cache entry, on the first call: the kernels have no side effects beyond their
    fresh outputs, so trial launches are harmless. A candidate that fails is skipped (_warmed)."""
    if _INTERPRET or not AUTOTUNE or len(candidates) < 2 or not x.is_cuda:
        return build(candidates[0])
    best, best_ms, best_cfg = None, float("inf"), None
    for cfg in candidates:
        run = _warmed(build, cfg, x)
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
            best, best_ms, best_cfg = run, ms, cfg
    if best is None:
        raise RuntimeError(f"every FP8 quantizer candidate failed on a {tuple(x.shape)} {x.dtype} input (see the warnings above)")
    log.debug("FP8 quantizer for %s %s: %s, %.4f ms, fastest of %d", tuple(x.shape), x.dtype, best_cfg, best_ms,
              len(candidates))
    return best


def _warmed(build, cfg, x):
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


def _cuda_takes(x2: torch.Tensor, name: str) -> bool:
    """What both CUDA C++ quantizers need: bf16 on a GPU, rows of 16-byte aligned vectors, the
    hardware cast (not the interpreter's software one), and kernels/<name>.cu built for the GPU."""
    return (x2.is_cuda and x2.dtype == torch.bfloat16 and not SOFT_CAST and x2.stride(1) == 1
            and x2.stride(0) % 8 == 0 and x2.data_ptr() % 16 == 0 and cuda_build.load(name, x2.device) is not None)


def cuda_both_ok(x2: torch.Tensor) -> bool:
    """Whether quant_both.cu takes x2: M and K whole 128-blocks, and _cuda_takes."""
    M, K = x2.shape
    return M % TOKEN_BLOCK == 0 and K % TOKEN_BLOCK == 0 and _cuda_takes(x2, "quant_both")


_CUDA_READY: set = set()
_VP, _I32, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
# entry point -> (its .cu, that library's once-per-device setup, the argument types)
_X_ARGS = [_VP, _I64, _VP, _VP, _VP, _VP, _I32, _I32, _I32, _I32, _I32, _VP]  # x, ldx, 4 outputs, M, K, 3 options, stream
_CUDA_ENTRY = {
    "infir_quant_token_both": ("quant_both", "infir_quant_token_both_init", _X_ARGS),
    "infir_quant_two_level": ("quant_two_level", "infir_quant_two_level_init", _X_ARGS),
    # qh, sh, h_e5m2, dy, ldy, 4 outputs, M, F, 3 options, stream
    "infir_swiglu_bwd_quant_both": ("quant_both", "infir_quant_token_both_init",
                                    [_VP, _VP, _I32, _VP, _I64, _VP, _VP, _VP, _VP, _I32, _I32, _I32, _I32, _I32, _VP]),
    # h, ldh, qh, sh, h_ue8m0, h_e5m2, 4 outputs, M, F, 3 options, stream
    "infir_swiglu_fwd_quant_both": ("quant_both", "infir_quant_token_both_init",
                                    [_VP, _I64, _VP, _VP, _I32, _I32, _VP, _VP, _VP, _VP, _I32, _I32, _I32, _I32, _I32,
                                     _VP]),
}


def _cuda_fn(entry: str, device: torch.device):
    """The ctypes function `entry` of its kernels/<name>.cu, that library's kernels set up on `device`."""
    name, init, argtypes = _CUDA_ENTRY[entry]
    lib = cuda_build.load(name, device)
    if (name, device) not in _CUDA_READY:
        with torch.cuda.device(device):
            err = getattr(lib, init)()
        if err:
            raise RuntimeError(f"{name}.cu: setting up its kernels failed with cudaError {err}")
        _CUDA_READY.add((name, device))
    fn = getattr(lib, entry)
    fn.restype = _I32
    fn.argtypes = argtypes
    return fn


def both_layouts_outputs(M: int, K: int, fmt: str, device: torch.device):
    """Empty (q [M, K], its scales, q^T [K, M], its scales) for quant_both.cu's kernels to write, each
    scale tensor outer-dim-major as scaled_mm reads it (s[kb * M + m], st[mb * K + k])."""
    dt, f32 = get_format(fmt).dtype, torch.float32
    return (torch.empty((M, K), dtype=dt, device=device),
            torch.empty_strided((M, K // TOKEN_BLOCK), (1, M), dtype=f32, device=device),
            torch.empty((K, M), dtype=dt, device=device),
            torch.empty_strided((K, M // TOKEN_BLOCK), (1, K), dtype=f32, device=device))


def _cuda_both_run(x2, scale_format, fmt, loads):
    fn = _cuda_fn("infir_quant_token_both", x2.device)
    M, K = x2.shape
    ld, idx = x2.stride(0), x2.device.index
    ue, e5 = int(scale_format == "ue8m0"), int(fmt == "e5m2")
    stream = torch._C._cuda_getCurrentRawStream

    def run(x):
        q, s, qt, st = both_layouts_outputs(M, K, fmt, x.device)
        err = fn(x.data_ptr(), ld, q.data_ptr(), s.data_ptr(), qt.data_ptr(), st.data_ptr(), M, K, ue, e5, loads,
                 stream(idx))
        if err:
            raise RuntimeError(f"quant_both.cu launch failed with cudaError {err} at x {tuple(x.shape)}")
        return (QTensor(q, s, "token", scale_format, fmt), QTensor(qt, st, "token", scale_format, fmt))
    return run


def _token_entry(x2, scale_format, fmt, rows, cols, block_m, config):
    if config is None and rows and cols:
        first = _pick("both", None)
        cands = [first] + [dict(c) for c in _BOTH_CONFIGS if c != first and (not c.get("CUDA") or cuda_both_ok(x2))]
        return _best(lambda c: _token_entry_cfg(x2, scale_format, fmt, rows, cols, block_m, c), cands, x2)
    if config is None and cols:
        first = _pick("cols", None)
        cands = [first] + [dict(c) for c in _COLS_CONFIGS if c != first]
        return _best(lambda c: _token_entry_cfg(x2, scale_format, fmt, rows, cols, block_m, c), cands, x2)
    if config is None and rows:
        first = _pick("rows", None)
        cands = [first] + [{"num_warps": w} for w in (2, 4, 8) if w != first["num_warps"]]
        return _best(lambda c: _token_entry_cfg(x2, scale_format, fmt, rows, cols, block_m, c), cands, x2)
    return _token_entry_cfg(x2, scale_format, fmt, rows, cols, block_m, config)


def _token_entry_cfg(x2, scale_format, fmt, rows, cols, block_m, config):
    (fmax, ue, out, div), dt = _consts(fmt, scale_format)
    soft = SOFT_CAST
    M, K = x2.shape
    stride = x2.stride(0)
    dev = x2.device
    idx = dev.index
    f32 = torch.float32
    n_kb, n_mb = triton.cdiv(K, TOKEN_BLOCK), triton.cdiv(M, TOKEN_BLOCK)
    u8 = torch.uint8
    if rows and cols:
        cfg = _pick("both", config)
        if cfg.get("CUDA"):
            if cuda_both_ok(x2):
                return _cuda_both_run(x2, scale_format, fmt, cfg["LOADS"])
            cfg = dict(_TRITON_BOTH)
        nw = cfg.pop("num_warps", 4)
        fused, trans_in, grouped, bn, bm_rows = cfg["FUSED"], cfg["TRANS_IN"], cfg["GROUPED"], cfg["BN"], cfg["BM_ROWS"]
        if fused:
            n = n_mb * n_kb
        elif grouped:  # per 128x128 region: its row programs, then its column programs
            n = n_mb * n_kb * (TOKEN_BLOCK // bm_rows + TOKEN_BLOCK // bn)
        else:
            n = triton.cdiv(M, bm_rows) * n_kb + n_mb * triton.cdiv(K, bn)
        launch = Launch(_quant_token_both_kernel, grid1d(n), nw)
        tail = (M, K, stride, fused, trans_in, grouped, bn, bm_rows, fmax, ue, out, div)

        def run(x):
            q = torch.empty((M, K), dtype=dt, device=dev)
            s = torch.empty_strided((M, n_kb), (1, M), dtype=f32, device=dev)
            qt = torch.empty((K, M), dtype=dt, device=dev)
            st = torch.empty_strided((K, n_mb), (1, K), dtype=f32, device=dev)
            if soft:
                launch(idx, x, q.view(u8), s, qt.view(u8), st, *tail)
            else:
                launch(idx, x, q, s, qt, st, *tail)
            return (QTensor(q, s, "token", scale_format, fmt), QTensor(qt, st, "token", scale_format, fmt))
    elif rows:
        cfg = _pick("rows", config)
        launch = Launch(_quant_rows_kernel, grid1d(triton.cdiv(M, block_m) * n_kb), cfg["num_warps"])
        tail = (M, K, stride, block_m, fmax, ue, out, div)

        def run(x):
            q = torch.empty((M, K), dtype=dt, device=dev)
            s = torch.empty_strided((M, n_kb), (1, M), dtype=f32, device=dev)
            launch(idx, x, q.view(u8) if soft else q, s, *tail)
            return QTensor(q, s, "token", scale_format, fmt), None
    elif cols:
        cfg = _pick("cols", config)
        bn = cfg["BN"]
        launch = Launch(_quant_cols_t_kernel, grid1d(n_mb * triton.cdiv(K, bn)), cfg.get("num_warps", 4))
        tail = (M, K, stride, bn, fmax, ue, out, div)

        def run(x):
            qt = torch.empty((K, M), dtype=dt, device=dev)
            st = torch.empty_strided((K, n_mb), (1, K), dtype=f32, device=dev)
            launch(idx, x, qt.view(u8) if soft else qt, st, *tail)
            return None, QTensor(qt, st, "token", scale_format, fmt)
    else:
        def run(x):
            return None, None
    return run


def quantize_token_triton(x2, scale_format="ue8m0", fmt="e4m3", rows=True, cols=False, block_m=32, config=None):
    """1x128 along K (rows) and/or 128x1 along M written transposed (cols). Returns (q, q_t).

    Scales come back as outer-dim-major views, the layout torch's blockwise scaled_mm takes.
    config: force one configuration of the both-layouts or cols kernel (tests); default: the one
    picked for the device (_DEFAULT_CFG). After the first call for a shape, a call costs one
    dict lookup, the output allocations and a direct launch.
    """
    if config is None:
        key = ("token", x2.shape, x2.stride(), x2.dtype, x2.device, x2.data_ptr() & 15 == 0,
               scale_format, fmt, rows, cols, block_m, SOFT_CAST, DIV_OVERRIDE)
        run = _ENTRIES.get(key)
        if run is None:
            _check_device(x2)
            run = _ENTRIES[key] = _token_entry(x2, scale_format, fmt, rows, cols, block_m, None)
        return run(x2)
    _check_device(x2)
    return _token_entry(x2, scale_format, fmt, rows, cols, block_m, config)(x2)


# _W_T_BY_TORCH: W^T for dgrad is QTensor.t() of W, its bytes transposed by torch in backward and
# freed after the dgrad GEMM (no second FP8 copy of a weight is kept). The block and per-tensor
# kernels once wrote W^T themselves from the transposed tile; on an H100 (Triton 3.6) that store
# left parts of W^T holding stale allocator bytes, so FP8 dgrads came out NaN (Triton's CPU
# interpreter was exact). The transposed activation kernels are held to the CPU reference on the
# GPU by tests/fp8 (with NaN bytes left in reused memory).
def _block_entry(x2, scale_format, fmt):
    first = _pick("block", None)
    cands = [first] + [{"num_warps": w} for w in (4, 8, 16) if w != first["num_warps"]]
    return _best(lambda c: _block_entry_cfg(x2, scale_format, fmt, c), cands, x2)


def _block_entry_cfg(x2, scale_format, fmt, cfg):
    (fmax, ue, out, div), dt = _consts(fmt, scale_format)
    soft = SOFT_CAST
    M, K = x2.shape
    dev = x2.device
    idx = dev.index
    f32 = torch.float32
    n_mb, n_kb = triton.cdiv(M, WEIGHT_BLOCK), triton.cdiv(K, WEIGHT_BLOCK)
    launch = Launch(_quant_block_kernel, grid1d(n_mb * n_kb), cfg["num_warps"])
    tail = (M, K, x2.stride(0), fmax, ue, out, div)
    u8 = torch.uint8

    def run(x):
        q = torch.empty((M, K), dtype=dt, device=dev)
        s = torch.empty((n_mb, n_kb), dtype=f32, device=dev)
        launch(idx, x, q.view(u8) if soft else q, s, *tail)
        return QTensor(q, s, "block", scale_format, fmt)
    return run


def quantize_block_triton(x2, scale_format="ue8m0", fmt="e4m3") -> QTensor:
    """128x128 blocks. dgrad's W^T is the result's .t() (see _W_T_BY_TORCH)."""
    key = ("block", x2.shape, x2.stride(), x2.dtype, x2.device, x2.data_ptr() & 15 == 0,
           scale_format, fmt, SOFT_CAST, DIV_OVERRIDE)
    run = _ENTRIES.get(key)
    if run is None:
        _check_device(x2)
        run = _ENTRIES[key] = _block_entry(x2, scale_format, fmt)
    return run(x2)


def _two_level_run(x2, scale_format, fmt, fold, write):
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


def _two_level_entry(x2, scale_format, fmt, fold, block_m, block_k, num_warps):
    (fmax, ue, out, div), _ = _consts(fmt, scale_format)
    # Measured on an H100 (16k x 8192, fp32 scales): the guarded fast quotient inside the K loop
    # ran slower (68% of copy bandwidth vs 78% with div_rn), so two-level keeps div_rn by default.
    div = 0 if DIV_OVERRIDE is None else DIV_OVERRIDE
    soft = SOFT_CAST
    M, K = x2.shape
    idx = x2.device.index
    block_k = min(block_k, max(32, triton.next_power_of_2(K)))
    launch = Launch(_quant_two_level_kernel, grid1d(triton.cdiv(M, block_m)), num_warps)
    tail = (M, K, x2.stride(0), triton.cdiv(K, MICRO_GROUP), block_m, block_k, fold, fmax, ue, out, div)
    u8 = torch.uint8

    def write(x, q, s, g, code):
        launch(idx, x, q.view(u8) if soft else q, s, g, code, *tail)
    return _two_level_run(x2, scale_format, fmt, fold, write)


_TWO_LEVEL_MAX_K = 49152  # quant_two_level.cu keeps a row in (at most 96 KB of) shared memory


def cuda_two_level_ok(x2: torch.Tensor) -> bool:
    """Whether quant_two_level.cu takes x2: whole groups of 32, at most _TWO_LEVEL_MAX_K elements
    per row, and _cuda_takes."""
    K = x2.shape[1]
    return K % MICRO_GROUP == 0 and K <= _TWO_LEVEL_MAX_K and _cuda_takes(x2, "quant_two_level")


def _cuda_two_level_run(x2, scale_format, fmt, fold):
    fn = _cuda_fn("infir_quant_two_level", x2.device)
    M, K = x2.shape
    ld, idx = x2.stride(0), x2.device.index
    opts = (int(scale_format == "ue8m0"), int(fmt == "e5m2"), int(fold))
    stream = torch._C._cuda_getCurrentRawStream

    def write(x, q, s, g, code):
        err = fn(x.data_ptr(), ld, q.data_ptr(), s.data_ptr(), g.data_ptr(), code.data_ptr(), M, K, *opts, stream(idx))
        if err:
            raise RuntimeError(f"quant_two_level.cu launch failed with cudaError {err} at x {tuple(x.shape)}")
    return _two_level_run(x2, scale_format, fmt, fold, write)


def quantize_two_level_triton(x2, scale_format="fp32", fmt="e4m3", fold=False, block_m=2, block_k=2048, num_warps=8,
                              impl="auto"):
    """MOSS two-level rows; fold=True returns fold_two_level() of it directly (granularity "row").

    impl: "triton" (this configuration of _quant_two_level_kernel), "cuda" (quant_two_level.cu;
    Triton where it does not take x2, see cuda_two_level_ok) or "auto" (the faster of the two on
    the first call for a shape)."""
    key = ("two_level", x2.shape, x2.stride(), x2.dtype, x2.device, x2.data_ptr() & 15 == 0,
           scale_format, fmt, fold, block_m, block_k, num_warps, SOFT_CAST, DIV_OVERRIDE, impl)
    run = _ENTRIES.get(key)
    if run is None:
        _check_device(x2)
        cands = [] if impl == "cuda" else ["triton"]
        if impl != "triton" and cuda_two_level_ok(x2):
            cands.append("cuda")
        build = lambda c: (_cuda_two_level_run(x2, scale_format, fmt, fold) if c == "cuda" else
                           _two_level_entry(x2, scale_format, fmt, fold, block_m, block_k, num_warps))
        run = _ENTRIES[key] = _best(build, cands or ["triton"], x2)
    return run(x2)


def _amax_entry(n: int, x: torch.Tensor):
    """Launch of the partial-amax pass over n contiguous elements: (launch, number of partials)."""
    cfg = _DEFAULT_CFG["amax"]
    block = cfg["BLOCK"] if not _INTERPRET else 1024
    n_part = max(1, min(triton.cdiv(n, block), cfg["per_sm"] * _n_sm(x.device)))
    return Launch(_amax_partial_kernel, grid1d(n_part), cfg["num_warps"]), n_part, block


def amax_triton(x: torch.Tensor, block: int = 8192) -> torch.Tensor:
    """max |x| as a float32 0-dim tensor (NaN counted as inf). (block: kept for callers; unused.)"""
    xc = x.contiguous().reshape(-1)
    key = ("amax", xc.shape, xc.dtype, xc.device, xc.data_ptr() & 15 == 0)
    ent = _ENTRIES.get(key)
    if ent is None:
        _check_device(xc)
        ent = _ENTRIES[key] = _amax_entry(xc.numel(), xc)
    launch, n_part, blk = ent
    part = torch.empty((n_part,), dtype=torch.float32, device=xc.device)
    launch(xc.device.index, xc, part, xc.numel(), blk)
    return part.amax() if n_part > 1 else part.reshape(())


def _tensor_entry(x2, scale_format, fmt, given, transpose, record):
    (fmax, ue, out, div), dt = _consts(fmt, scale_format, given_scale=given)
    soft = SOFT_CAST
    M, K = x2.shape
    dev = x2.device
    idx = dev.index
    f32 = torch.float32
    u8 = torch.uint8
    cfg = _DEFAULT_CFG["scalar"]
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
        return out_q, (out_q.t() if transpose else None)  # X^T of a per-tensor activation
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
           scale_format, fmt, given, transpose, record, SOFT_CAST, DIV_OVERRIDE)
    run = _ENTRIES.get(key)
    if run is None:
        _check_device(x2)
        run = _ENTRIES[key] = _tensor_entry(x2, scale_format, fmt, given, transpose, record)
    return run(x2, scale, record_amax if record else run.dummy_f)


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
        q = quantize_block_triton(x2, scale_format, fmt)
    elif granularity == "two_level":
        q = quantize_two_level_triton(x2, scale_format, fmt)
    elif granularity == "tensor":
        q, _ = quantize_tensor_triton(x2.reshape(1, -1) if x2.dim() != 2 else x2, scale_format, fmt)
    else:
        raise ValueError(f"unknown granularity {granularity!r}")
    if granularity == "block" or x.dim() == 2:
        return q
    q.data = q.data.reshape(x.shape)
    if granularity in ("token", "two_level"):
        q.scale = q.scale.reshape(*lead, q.scale.shape[-1])
    if granularity == "two_level":
        q.global_scale = q.global_scale.reshape(lead)
        q.local_exp = q.local_exp.reshape(*lead, q.local_exp.shape[-1])
    return q
