"""The storage formats on their own: weight splitting, companded 8-bit states, stochastic and
nearest rounding to bf16."""
import math

import pytest
import torch

from infir.optim import companding, weight_split
from infir.optim.sr_adamw import round_to_bf16_stochastic, sr_noise


def _spread(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen) * 10.0 ** torch.randint(-30, 4, (n,), generator=gen)


def test_split_master_keeps_about_16_mantissa_bits():
    x = _spread(100_000, 0)
    narrow, corr = weight_split.split_master(x)
    assert narrow.dtype == torch.bfloat16 and corr.dtype == torch.int8
    assert torch.equal(narrow, x.to(torch.bfloat16))  # the weight itself is the bf16 rounding
    back = weight_split.merge_master(narrow, corr)
    # error <= half a correction level: half-ULP / 127 / 2 = ULP / 508 of the bf16 value
    ulp = 2.0 ** (weight_split.half_ulp_log2(narrow) + 1).double()
    assert ((back.double() - x.double()).abs() <= ulp / 508 * 1.0001).all()
    # a plain bf16 copy is off by up to half a ULP: ~250x worse
    assert ((narrow.double() - x.double()).abs() / ulp).max() > 0.45


def test_split_master_handles_zero_and_subnormals():
    x = torch.tensor([0.0, -0.0, 1e-40, -3e-39, 1e-38, 2.0 ** -133])
    back = weight_split.merge_master(*weight_split.split_master(x))
    assert ((back - x).abs() <= 2.0 ** -134).all()


@pytest.mark.parametrize("n", [32 * 50, 1001])
def test_companded_momentum_error_is_bounded_by_the_code_spacing(n):
    m = _spread(n, 1) * 1e-3
    codes, scales = companding.quantize_momentum(m)
    assert codes.dtype == torch.int8 and scales.dtype == torch.float16
    assert scales.numel() == companding.num_groups(n)
    back = companding.dequantize_momentum(codes, scales)
    groups = companding._grouped(m)
    absmax = groups.abs().amax(1, keepdim=True)
    # softsign y = 2x/(1+|x|) has slope <= 2, so a half-code error in y costs <= 1/254 of x near
    # the group max and less near zero (plus the fp16 rounding of the scale, 2**-11 relative)
    err = (companding._grouped(back) - groups).abs() / absmax.clamp_min(1e-30)
    assert err.max() <= 1 / 127 + 2 ** -10
    # the point of companding: small values inside a group keep more relative precision than
    # linear int8 would give them (its absolute error is uniform, 1/254 of the max)
    small = (groups.abs() < 0.1 * absmax) & (groups.abs() > 0)
    assert err[small].mean() < 0.5 / 254


def test_companded_variance_is_nonnegative_and_exact_at_group_max():
    v = _spread(4096, 2).abs() * 1e-6
    codes, scales = companding.quantize_variance(v)
    assert codes.dtype == torch.uint8
    back = companding.dequantize_variance(codes, scales)
    assert (back >= 0).all()
    groups, rec = companding._grouped(v), companding._grouped(back)
    top = groups.argmax(1)
    rows = torch.arange(groups.shape[0])
    # the max of each group decodes to its fp16-rounded self (code 255)
    torch.testing.assert_close(rec[rows, top], groups[rows, top], rtol=2 ** -10, atol=0)
    root_err = (rec.sqrt() - groups.sqrt()).abs() / groups.sqrt().amax(1, keepdim=True)
    assert root_err.max() <= 0.5 / 255 + 2 ** -10


def test_all_zero_state_stays_zero():
    codes, scales = companding.quantize_momentum(torch.zeros(70))
    assert torch.equal(companding.dequantize_momentum(codes, scales), torch.zeros(70))
    codes, scales = companding.quantize_variance(torch.zeros(70))
    assert torch.equal(companding.dequantize_variance(codes, scales), torch.zeros(70))


def test_stochastic_rounding_picks_a_neighbour_and_is_unbiased():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, generator=gen)
    reps = 4000
    noise = torch.randint(0, 1 << 16, (reps, 64), generator=gen, dtype=torch.int32)
    out = round_to_bf16_stochastic(x.expand(reps, 64), noise).float()
    # the two bf16 neighbours of x: its truncation toward zero, and one ULP further out
    truncated = (x.view(torch.int32) & ~0xFFFF).view(torch.float32)
    up = torch.nextafter(truncated.to(torch.bfloat16),
                         (truncated * 2).to(torch.bfloat16)).float()
    assert ((out == truncated) | (out == up)).all()
    # mean over 4000 draws: standard error ~ ULP / 126; 5 sigma
    ulp = (up - truncated).abs()
    # each draw is a Bernoulli in {0, ULP} around the truncation: std <= ULP / 2 per draw
    assert ((out.mean(0) - x).abs() < 5 * 0.5 * ulp / math.sqrt(reps)).all()
    # round-to-nearest, by contrast, has a bias of up to half a ULP on these values
    assert ((x.to(torch.bfloat16).float() - x).abs() / ulp).max() > 0.3


def test_sr_noise_depends_only_on_seed():
    a, b = sr_noise((5, 7), 11, "cpu"), sr_noise((5, 7), 11, "cpu")
    assert torch.equal(a, b) and a.shape == (3, 5, 7)
    assert not torch.equal(a, sr_noise((5, 7), 12, "cpu"))
    assert 0 <= a.min() and a.max() < 1 << 16
