"""Bit-level Triton helpers shared by the fused optimizer kernels.

Conversions are written on the bits on purpose: the results must equal torch's on every input,
and the Triton interpreter (TRITON_INTERPRET=1, used by the CPU tests) truncates fp32 -> bf16
instead of rounding to nearest even, so ``x.to(tl.bfloat16)`` would test a different function."""
import triton
import triton.language as tl


@triton.jit
def pow2(k):
    """2**k as fp32 for int32 k in [-126, 127], exact."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def bf16_round_nearest(x):
    """fp32 -> bf16, round to nearest even (NaN stays NaN)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(x != x, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def bf16_round_stochastic(x, noise):
    """fp32 -> bf16, rounding the magnitude up with probability (dropped bits) / 2**16; ``noise``
    uint32 in [0, 2**16). Same function as sr_adamw.round_to_bf16_stochastic."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + noise) >> 16
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def bf16_half_ulp_log2(narrow):
    """log2 of half the bf16 ULP at each bf16 value (int32); see weight_split.half_ulp_log2."""
    exponent_bits = (narrow.to(tl.uint16, bitcast=True).to(tl.int32) & 0x7FFF) >> 7
    exponent = tl.where(exponent_bits == 0, -126, exponent_bits - 127)
    return exponent - 8
