"""The Triton helpers every FP8 quantization kernel shares, and their host-side constants.

Bit-exactness rules shared with the reference (infir/fp8/quantize.py): x / scale correctly rounded
(IEEE round-to-nearest), NaN counted as +inf in every amax, saturating RNE cast, exponent of
amax/fmax read from the bits (no log2). The quotient is computed one of three ways (`DIV`, see
quot), all equal to IEEE division bit for bit: 0 `div_rn`; 1 for power-of-two scales (UE8M0),
x * (1/s), exact since 1/s is a power of two too; 2 for FP32 scales on a GPU, x * RN(1/s) refined by
two Markstein corrections (fma), exact while s is in [2^-80, 2^80] (a tile with a scale outside
falls back to div_rn). On an H100 the fast quotients took the rows, cols, block and per-tensor
kernels to 89-97% of copy bandwidth (from 70-89%); the two-level kernel keeps div_rn (its guarded
fast path was slower). The reference is exact on the CPU; torch's CUDA division is not always
bit-identical to it for FP32 scales, so GPU tests compare with CPU results.

In Triton's interpreter (policy.interpret) the FP8 cast is done in integer arithmetic
(fp8_bits_rne) and written through uint8 views, because the interpreter's own float8 cast rounds
differently, and FP32 scales use div_rn (older interpreters round fma twice); GPU tests hold the
casts and quotients together.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..formats import get_format
from ..policy import kernel_policy

TL_DTYPE = {"e4m3": tl.float8e4nv, "e5m2": tl.float8e5}


@triton.jit
def ceil_log2(x):
    bits = x.to(tl.int32, bitcast=True)
    biased = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    normal = biased - 127 + (mant != 0).to(tl.int32)
    sub = tl.where(mant > (1 << 22), -126, -127)
    e = tl.where(biased == 0, sub, normal)
    return tl.minimum(tl.maximum(e, -127), 127)


@triton.jit
def exp2i(e):
    bits = tl.where(e >= -126, (e + 127) << 23, 1 << 22)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def abs_nan_inf(x):
    a = tl.abs(x.to(tl.float32))
    return tl.where(a != a, float("inf"), a)


@triton.jit
def scale_from_amax(amax, FMAX: tl.constexpr, UE8M0: tl.constexpr):
    s = tl.math.div_rn(amax, tl.full(amax.shape, FMAX, tl.float32))
    if UE8M0:
        out = exp2i(ceil_log2(s))
    else:
        out = s
    out = tl.where(s == 0, 1.0, out)
    return tl.where(amax == float("inf"), float("nan"), out)


@triton.jit
def fp8_bits_rne(v, MBITS: tl.constexpr, BIAS: tl.constexpr):
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
def fp8_bits_to_f32(c, MBITS: tl.constexpr, BIAS: tl.constexpr):
    c = c.to(tl.int32)
    e = (c >> MBITS) & ((1 << (7 - MBITS)) - 1)
    m = c & ((1 << MBITS) - 1)
    mag = tl.where(e == 0, m.to(tl.float32), (m + (1 << MBITS)).to(tl.float32))
    v = mag * exp2i(tl.maximum(e, 1) - BIAS - MBITS)
    return tl.where((c & 0x80) != 0, -v, v)


@triton.jit
def fp8_round(q, FMAX: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """q (already saturated) rounded to the FP8 grid, as float32 (NaN stays NaN)."""
    if OUT_DTYPE == tl.uint8:
        if FMAX == 448.0:
            r = fp8_bits_to_f32(fp8_bits_rne(q, 3, 7), 3, 7)
        else:
            r = fp8_bits_to_f32(fp8_bits_rne(q, 2, 15), 2, 15)
        r = tl.where(q != q, q, r)
    else:
        r = q.to(OUT_DTYPE).to(tl.float32)
    return r


@triton.jit
def cast_fp8(q, FMAX: tl.constexpr, OUT_DTYPE: tl.constexpr):
    q = tl.clamp(q, -FMAX, FMAX, propagate_nan=tl.PropagateNan.ALL)
    if OUT_DTYPE == tl.uint8:
        if FMAX == 448.0:
            r = fp8_bits_rne(q, 3, 7)
        else:
            r = fp8_bits_rne(q, 2, 15)
    else:
        r = q.to(OUT_DTYPE)
    return r



_LO_SAFE = tl.constexpr(8.271806125530277e-25)  # 2^-80
_HI_SAFE = tl.constexpr(1.2089258196146292e24)  # 2^80


@triton.jit
def recip(s):
    return tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)


@triton.jit
def inv_scale(s, UE8M0: tl.constexpr):
    """1/s, exactly, for a scale from scale_from_amax. UE8M0: s = 2^e (e in [-127, 127]), 1, or
    NaN, so 1/s = 2^-e is built from the exponent bits instead of a division."""
    if UE8M0:
        e = ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        # 2^-127 is the subnormal 1 << 22: biased exponent 0 also gives e = -127
        r = tl.where(s != s, s, exp2i(-e))
    else:
        r = recip(s)
    return r


@triton.jit
def quot_safe(s):
    """1 where a fast quotient by s is exact (see quot), else 0."""
    return (((s >= _LO_SAFE) & (s <= _HI_SAFE)) | (s != s)).to(tl.int32)


@triton.jit
def quot(x, s, y, DIV: tl.constexpr):
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
def q8(x, s, y, ok, FMAX: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr):
    """x / s as FP8 (or its uint8 bits); ok (scalar): the fast quotient is exact for this tile."""
    if DIV == 0:
        q = quot(x, s, y, 0)
    else:
        if ok:
            q = quot(x, s, y, DIV)
        else:
            q = quot(x, s, y, 0)
    return cast_fp8(q, FMAX, OUT_DTYPE)


@triton.jit
def quot_ok(s, DIV: tl.constexpr):
    """Tile guard for a 1-D vector of scales: only DIV 2 needs one (UE8M0 scales are in range)."""
    if DIV == 2:
        r = tl.min(quot_safe(s), axis=0) == 1
    else:
        r = True
    return r


@triton.jit
def mask_t(rm, rk, M, K):
    # The bounds mask of a transposed [K-tile, M-tile] store, built in that orientation rather than
    # by tl.trans(mask): the weight kernels' transposed store with a transposed mask went wrong on
    # an H100 (see quant_block.py), so no kernel here transposes a boolean tile.
    return (rk[:, None] < K) & (rm[None, :] < M)


# ----------------------------------------------------------------------------- host side


def consts(fmt: str, scale_format: str, given_scale: bool = False):
    """((FMAX, UE8M0, OUT_DTYPE, DIV) constexprs of a quantization kernel, the torch FP8 dtype).

    OUT_DTYPE is uint8 in the interpreter (the software cast). DIV picks the quotient (see quot):
    1 for UE8M0 scales, 2 for FP32 ones compiled, 0 (div_rn) for FP32 interpreted and for a scale
    given by the caller, which can be anything (x/s may overflow)."""
    f = get_format(fmt)
    interpret = kernel_policy().interpret
    ue = scale_format == "ue8m0"
    if given_scale:
        div = 0
    else:
        div = 1 if ue else (0 if interpret else 2)
    return (f.max, ue, tl.uint8 if interpret else TL_DTYPE[fmt], div), f.dtype


def fp8_view(t: torch.Tensor) -> torch.Tensor:
    """The pointer a kernel writes or reads FP8 through: the tensor itself, or its uint8 view in the
    interpreter (the software cast)."""
    fp8 = t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    return t.view(torch.uint8) if fp8 and kernel_policy().interpret else t


def check_device(x: torch.Tensor) -> None:
    if x.dim() == 2 and x.stride(-1) != 1:
        raise ValueError(f"Triton FP8 kernels need unit stride along the last dim, got strides {x.stride()}; "
                         "pass x.contiguous()")
    if not x.is_cuda and not kernel_policy().interpret:
        raise RuntimeError(
            "Triton FP8 kernels got a CPU tensor: run them on CUDA, or set TRITON_INTERPRET=1 before "
            "importing infir.fp8.kernels to run them in Triton's interpreter (tests do this)"
        )


def as_2d(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2
