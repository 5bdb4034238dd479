"""ULP-normalised weight splitting (FlashOptim §3.1, Algorithm 1): an fp32 master weight stored as
its bf16 rounding plus an int8 correction, 3 bytes instead of 4.

The correction is the rounding error ``e = x - bf16(x)`` measured in units of half a bf16 ULP of
``bf16(x)``. Round-to-nearest bounds ``|e|`` by that half ULP, so the ratio lies in [-1, 1] and
127 integer levels cover it with no scale to store: the exponent of the bf16 value *is* the
scale. The result keeps ~15 mantissa bits: enough for updates far below one bf16 ULP to
accumulate, which is what plain bf16 weights lose.

The arithmetic order is the one of the fused kernels (ours and the `flashoptim` package), so
the plain-PyTorch functions here are the bit-exact twin of both.
"""
import torch

from infir.optim.adam_math import div

BF16_MANTISSA_BITS = 7
CORRECTION_LEVELS = 127.0  # int8 correction in [-127, 127]


def half_ulp_log2(narrow: torch.Tensor) -> torch.Tensor:
    """log2 of half the bf16 ULP at each value (int32). Zero and subnormals share the smallest
    normal exponent, -126, because subnormals are evenly spaced at that ULP."""
    if narrow.dtype != torch.bfloat16:
        raise TypeError(f"weight splitting stores bf16 weights, got {narrow.dtype}; cast the model "
                        "to bf16 (model.bfloat16()) or use torch AdamW for fp32 weights")
    exponent_bits = (narrow.view(torch.int16).to(torch.int32) & 0x7FFF) >> BF16_MANTISSA_BITS
    exponent = torch.where(exponent_bits == 0, -126, exponent_bits - 127)
    return exponent - BF16_MANTISSA_BITS - 1


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2**k as fp32 for integer k in the normal range [-126, 127], exact (built from the bits)."""
    return ((k.to(torch.int32) + 127) << 23).view(torch.float32)


def _scale_by_pow2(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # x * 2**k with |k| up to ~134, outside fp32's exponent range: split k in two halves so each
    # factor is a normal power of two; each product is exact, so the result equals x * 2**k.
    half = torch.div(k, 2, rounding_mode="floor")
    return x * pow2(half) * pow2(k - half)


def split_master(master: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 master weights -> (bf16 weights, int8 corrections). Algorithm 1, encode."""
    master = master.float()
    narrow = master.to(torch.bfloat16)
    err = master - narrow.float()
    ratio = _scale_by_pow2(err, -half_ulp_log2(narrow)).clamp(-1.0, 1.0) * CORRECTION_LEVELS
    # round half away from zero, as the kernels do
    rounded = torch.floor(ratio.abs() + 0.5).copysign(ratio)
    return narrow, rounded.to(torch.int8)


def correction_unit(correction: torch.Tensor) -> torch.Tensor:
    """int8 correction -> its value in half-ULPs (a 256-entry table in the fused kernel)."""
    return div(correction.float(), CORRECTION_LEVELS)


def merge_master(narrow: torch.Tensor, correction: torch.Tensor) -> torch.Tensor:
    """(bf16 weights, int8 corrections) -> fp32 master weights. Algorithm 1, decode."""
    if correction.dtype != torch.int8:
        raise TypeError(f"weight corrections are int8, got {correction.dtype}")
    return narrow.float() + _scale_by_pow2(correction_unit(correction), half_ulp_log2(narrow))
