import math

import pytest
import torch

from infir.fp8.formats import (
    ceil_log2_exponent,
    exp2_float32,
    round_scale,
    ue8m0_decode,
    ue8m0_encode,
)


def _exact_ceil_log2(v: float) -> int:
    m, e = math.frexp(v)  # v = m * 2^e, m in [0.5, 1)
    return e - 1 if m == 0.5 else e


def test_ceil_log2_matches_exact_math_on_random_and_edge_values():
    g = torch.Generator().manual_seed(1)
    x = torch.exp(torch.randn(5000, generator=g) * 20).float()
    powers = torch.tensor([2.0 ** k for k in range(-120, 120)], dtype=torch.float32)
    just_above = torch.nextafter(powers, torch.full_like(powers, float("inf")))
    vals = torch.cat([x, powers, just_above])
    got = ceil_log2_exponent(vals)
    want = torch.tensor([max(-127, min(127, _exact_ceil_log2(float(v)))) for v in vals], dtype=torch.int32)
    assert torch.equal(got, want)


def test_ue8m0_scale_is_power_of_two_at_least_fp32_scale_and_below_twice():
    g = torch.Generator().manual_seed(2)
    s = torch.exp(torch.randn(10000, generator=g) * 10).float()
    u = round_scale(s, "ue8m0")
    m, _ = torch.frexp(u)
    assert torch.all(m == 0.5), "UE8M0 scales must be powers of two"
    assert torch.all(u >= s)
    assert torch.all(u < 2 * s)
    assert torch.equal(round_scale(torch.tensor([0.25, 1.0, 8.0]), "ue8m0"), torch.tensor([0.25, 1.0, 8.0]))


def test_ue8m0_clamps_to_e8m0_range_and_round_trips_codes():
    tiny = torch.tensor([1e-45, 2.0 ** -140], dtype=torch.float32)  # below 2^-127: Algorithm 1 clamps
    assert torch.equal(ue8m0_encode(tiny), torch.zeros(2, dtype=torch.uint8))
    codes = torch.arange(0, 255, dtype=torch.uint8)
    assert torch.equal(ue8m0_encode(ue8m0_decode(codes)), codes)
    assert float(exp2_float32(torch.tensor(-127))) == 2.0 ** -127


@pytest.mark.parametrize("fmt", ["fp32", "ue8m0"])
def test_special_scales_zero_gives_one_nonfinite_gives_nan(fmt):
    out = round_scale(torch.tensor([0.0, float("inf"), float("nan"), 3.0]), fmt)
    assert out[0] == 1.0
    assert torch.isnan(out[1]) and torch.isnan(out[2])
    assert out[3] >= 3.0


def test_unknown_scale_format_names_the_options():
    with pytest.raises(ValueError, match="ue8m0"):
        round_scale(torch.ones(1), "e8m0")


@pytest.mark.parametrize("fmt_name", ["e4m3", "e5m2"])
def test_ue8m0_scale_shortcut_of_the_cuda_kernels_equals_the_reference(fmt_name):
    """fp8_common.cuh's scale_from_amax<UE8M0> skips the division where RN(amax / fmax) is normal:
    e = E - k + (mantissa > 0x600000), fmax = 1.75 * 2^k. Held to the reference on every float32
    mantissa at the fast path's lowest exponents and at a few ordinary and top ones."""
    from infir.fp8.formats import get_format, scale_from_amax

    fmt = get_format(fmt_name)
    k = int(math.log2(fmt.max / 1.75))
    mant = torch.arange(1 << 23, dtype=torch.int32)
    for E in [k - 125, k - 124, k - 123, -1, 0, 9, 127]:  # k - 125: the lowest exponent the shortcut takes
        amax = ((E + 127) << 23 | mant).view(torch.float32)
        shortcut = exp2_float32(E - k + (mant > 0x600000).to(torch.int32))
        assert torch.equal(shortcut, scale_from_amax(amax, fmt, "ue8m0")), f"exponent {E}"
