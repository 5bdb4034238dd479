"""FP8 element formats and scale formats.

Element formats: E4M3 (max 448, no inf) and E5M2 (max 57344). Scales are *dequantization
multipliers* (x ~= q * scale) held in float32, in one of two scale formats:

- "fp32": scale = amax / fmax, the tightest scale (InfiR2's "FP8 w. FP32 scale").
- "ue8m0": InfiR2 Algorithm 1: the exponent of amax / fmax rounded *up* and clamped to
  E8M0's range [-127, 127], so the scale is a power of two in [fp32 scale, 2 * fp32 scale).

Special cases (one rule used by every quantizer and kernel, so they agree bit for bit):
- a unit (tensor / block / group) whose amax is 0 gets scale 1.0 in both formats (its data is 0
  either way). Algorithm 1 taken literally would give 2^-127, a float32 subnormal that a GPU
  running flush-to-zero would turn into 0 and then 0/0 = NaN.
- a unit holding NaN or +-inf gets a NaN scale, so its data and its dequantized values are NaN:
  a non-finite input never comes back as a finite number.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fp8Format:
    name: str
    dtype: torch.dtype
    max: float


E4M3 = Fp8Format("e4m3", torch.float8_e4m3fn, 448.0)
E5M2 = Fp8Format("e5m2", torch.float8_e5m2, 57344.0)
FORMATS = {f.name: f for f in (E4M3, E5M2)}
SCALE_FORMATS = ("fp32", "ue8m0")

# E8M0 covers 2^-127 .. 2^127 (code 255 is NaN). 2^-127 is a float32 subnormal: bit 22 set.
UE8M0_MIN_EXP = -127
UE8M0_MAX_EXP = 127
UE8M0_BIAS = 127


def get_format(name: str) -> Fp8Format:
    if name not in FORMATS:
        raise ValueError(f"unknown FP8 format {name!r}; use one of {sorted(FORMATS)}")
    return FORMATS[name]


def check_scale_format(scale_format: str) -> None:
    if scale_format not in SCALE_FORMATS:
        raise ValueError(f"unknown scale format {scale_format!r}; use one of {list(SCALE_FORMATS)}")


def ceil_log2_exponent(x: torch.Tensor) -> torch.Tensor:
    """ceil(log2(x)) for non-negative float32 x, exact, read from the bits.

    torch.log2 rounds: for x just above 2^k it can return exactly k, and ceil would then give a
    scale *below* the FP32 one (the overflow Algorithm 1 exists to prevent). Result is clamped to
    [-127, 127]: every subnormal x <= 2^-127 (and 0) maps to -127, as Algorithm 1's clamp does.
    """
    bits = x.float().contiguous().view(torch.int32)
    biased = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    normal = biased - UE8M0_BIAS + (mant != 0).to(torch.int32)
    # subnormals: x in (2^-127, 2^-126) -> -126, else -127
    sub = torch.where(mant > (1 << 22), -126, -127).to(torch.int32)
    e = torch.where(biased == 0, sub, normal)
    return e.clamp(UE8M0_MIN_EXP, UE8M0_MAX_EXP)


def exp2_float32(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32 for integer e in [-127, 127], built from bits (exact, no libm)."""
    e = e.to(torch.int32)
    bits = torch.where(e >= -126, (e + UE8M0_BIAS) << 23, torch.full_like(e, 1 << 22))
    return bits.view(torch.float32)


def ue8m0_encode(scale: torch.Tensor) -> torch.Tensor:
    """Algorithm 1 of InfiR2 applied to an FP32 scale: uint8 code = ceil(log2 scale) + 127."""
    return (ceil_log2_exponent(scale) + UE8M0_BIAS).to(torch.uint8)


def ue8m0_decode(code: torch.Tensor) -> torch.Tensor:
    return exp2_float32(code.to(torch.int32) - UE8M0_BIAS)


def round_scale(fp32_scale: torch.Tensor, scale_format: str) -> torch.Tensor:
    """The stored scale for an FP32 scale amax / fmax, in the given scale format.

    Non-finite scales stay NaN, zero scales follow the module docstring's rule.
    """
    check_scale_format(scale_format)
    s = fp32_scale.float()
    out = exp2_float32(ceil_log2_exponent(s)) if scale_format == "ue8m0" else s
    out = torch.where(s == 0, torch.ones_like(s), out)
    return torch.where(torch.isfinite(s), out, torch.full_like(s, float("nan")))


def amax_with_nan_as_inf(x: torch.Tensor, dim=None, keepdim: bool = False) -> torch.Tensor:
    """max |x| in float32 where NaN counts as +inf, so a reduction can never drop a NaN
    (GPU max instructions return the non-NaN operand)."""
    a = x.float().abs()
    a = torch.where(torch.isnan(a), torch.full_like(a, float("inf")), a)
    if dim is None:
        return a.amax()
    return a.amax(dim=dim, keepdim=keepdim)


def scale_from_amax(amax: torch.Tensor, fmt: Fp8Format, scale_format: str) -> torch.Tensor:
    """amax (float32, inf meaning 'non-finite seen') -> stored dequantization scale."""
    # divided by a tensor: torch's CUDA division by a Python scalar multiplies by its reciprocal, which
    # is not the correctly rounded quotient the kernels compute (div_rn)
    return round_scale(amax / torch.full_like(amax, fmt.max), scale_format)


def cast_to_fp8(x_scaled: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """Round-to-nearest-even cast with saturation at +-fmax; NaN stays NaN.

    The clamp matters for "fp32" scales: amax / (amax / 448) can round to 448.00003, and torch's
    cast sends out-of-range values to NaN (E4M3) or inf (E5M2).
    """
    return x_scaled.clamp(-fmt.max, fmt.max).to(fmt.dtype)
