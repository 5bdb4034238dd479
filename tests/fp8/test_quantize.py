from dataclasses import replace

import pytest
import torch

from infir.fp8 import dequantize, quant_stats, quantization_snr_db, quantize
from infir.fp8.formats import get_format
from infir.fp8.quantize import fold_two_level

GRANS = ["tensor", "token", "block", "two_level"]
MBITS = {"e4m3": 3, "e5m2": 2}
MIN_NORMAL = {"e4m3": 2.0 ** -6, "e5m2": 2.0 ** -14}


def heavy(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 1.5)


def element_scale(q):
    """Each element's scale, broadcast by dequantize itself (data replaced by ones)."""
    return dequantize(replace(q, data=torch.ones_like(q.data)))


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("sf", ["ue8m0", "fp32"])
def test_no_overflow_and_elementwise_error_bound(gran, fmt, sf):
    x = heavy((200, 300), seed=hash((gran, fmt, sf)) % 1000)  # 200 x 300: no dim divides by 128
    q = quantize(x, gran, sf, fmt)
    f = get_format(fmt)
    assert q.data.dtype == f.dtype and q.data.shape == x.shape and q.scale.dtype == torch.float32
    d = q.data.float()
    assert torch.isfinite(d).all() and d.abs().max() <= f.max
    err = (dequantize(q) - x).abs()
    # round to nearest: half an ulp of the scaled value (relative 2^-(m+1)) in the normal range,
    # half the subnormal step (min_normal * 2^-m / 2, times the scale) below it
    scale = element_scale(q)
    bound = torch.maximum(x.abs() * 2.0 ** -(MBITS[fmt] + 1), scale * MIN_NORMAL[fmt] * 2.0 ** -(MBITS[fmt] + 1))
    assert torch.all(err <= bound * (1 + 1e-6))


@pytest.mark.parametrize("gran,scale_shape", [("tensor", ()), ("token", (200, 3)), ("block", (2, 3)), ("two_level", (200, 10))])
def test_scale_shapes_pad_internally(gran, scale_shape):
    q = quantize(heavy((200, 300), 3), gran)
    assert tuple(q.scale.shape) == scale_shape


def test_scales_bound_each_unit_amax():
    x = heavy((256, 384), 4)
    for sf in ("ue8m0", "fp32"):
        q = quantize(x, "token", sf)
        amax = x.abs().unflatten(-1, (3, 128)).amax(-1)
        s = q.scale.double()
        if sf == "ue8m0":  # Algorithm 1: never below amax / fmax, less than twice it
            assert torch.all(s * 448 >= amax) and torch.all(s * 448 < 2 * amax)
        else:  # amax / fmax rounded to nearest float32
            assert torch.allclose(s * 448, amax.double(), rtol=2 ** -23, atol=0)
        qb = quantize(x, "block", sf)
        bamax = x.abs().unflatten(0, (2, 128)).unflatten(-1, (3, 128)).amax(dim=(1, 3))
        assert torch.all(qb.scale.double() * 448 >= bamax * (1 - 2 ** -23))


def test_two_level_matches_moss_eq_2_3():
    x = heavy((64, 256), 5)
    q = quantize(x, "two_level", "fp32")
    s_i = x.abs().unflatten(-1, (8, 32)).amax(-1) / 448
    s = s_i.amax(-1)
    assert torch.equal(q.global_scale, s)
    ss = q.scale / s[:, None]
    assert torch.all(ss <= 1) and torch.all(ss >= s_i / s[:, None])
    m, _ = torch.frexp(ss)
    assert torch.all(m == 0.5), "level-2 scales must be powers of two"
    assert torch.equal(2.0 ** (q.local_exp.float() - 127), ss)


def test_fold_two_level_is_exact_in_the_normal_range():
    x = heavy((64, 512), 12)
    q = quantize(x, "two_level", "fp32")
    f = fold_two_level(q)
    assert f.granularity == "row" and f.scale.shape == (64, 1)
    exact, folded = dequantize(q), dequantize(f)
    normal = (q.data.float().abs() * (q.scale / q.global_scale[:, None]).repeat_interleave(32, -1)) >= 2.0 ** -6
    assert torch.equal(folded[normal], exact[normal])
    assert (folded - exact).norm() / exact.norm() < 1e-3  # only values folded below 2^-6 re-round
    with pytest.raises(ValueError, match="two_level"):
        fold_two_level(quantize(x, "token"))


def test_zero_blocks_subnormals_and_transposed_blocks():
    x = heavy((256, 256), 6)
    x[:128, :128] = 0
    x[128:, :128] = 1e-40  # float32 subnormals
    for gran in GRANS:
        q = quantize(x, gran)
        assert torch.isfinite(q.scale).all()
        assert torch.equal(dequantize(q)[:128, :128], torch.zeros(128, 128))
    qb = quantize(x, "block")
    assert torch.equal(qb.t().data.view(torch.uint8), quantize(x.t().contiguous(), "block").data.view(torch.uint8))


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_input_never_comes_back_finite(gran, bad):
    x = heavy((256, 256), 7)
    x[5, 7] = bad
    dq = dequantize(quantize(x, gran))
    assert torch.isnan(dq[5, 7])
    assert torch.isfinite(dq[200:, 200:]).all() or gran == "tensor"


def test_bf16_input_and_batched_leading_dims():
    x = heavy((3, 50, 200), 8).bfloat16()
    for gran in ("token", "two_level", "tensor"):
        q = quantize(x, gran)
        assert q.data.shape == x.shape
        assert (dequantize(q) - x.float()).norm() / x.float().norm() < 0.05


def heavy_tailed_activations(seed):
    """Student-t values, per-32-group log-normal magnitudes, a few outlier channels."""
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():  # StudentT samples from the global RNG: seed it too, or the test is flaky
        torch.manual_seed(seed)
        t = torch.distributions.StudentT(3.0).sample((256, 1024))
    groups = torch.exp(torch.randn(256, 32, 1, generator=g) * 2).expand(256, 32, 32).reshape(256, 1024)
    x = t * groups
    x[:, torch.randperm(1024, generator=g)[:8]] *= 30
    return x


def test_snr_per_tensor_below_per_group_and_two_level_on_heavy_tailed_activations():
    # MOSS Table 7's first inequality holds for FP8 E4M3. Its second (two-level-32 above
    # per-group-128) comes from Theorem 1's uniform-noise model; in a floating-point format a
    # power-of-two rescale leaves every mantissa unchanged, so two-level only differs from
    # per-group-128 (FP32 scales) where values underflow, and the two land within ~1 dB here.
    x = heavy_tailed_activations(9)
    snr = {gran: quantization_snr_db(x, quantize(x, gran, "fp32")) for gran in ("tensor", "token", "two_level")}
    assert snr["tensor"] < snr["token"] and snr["tensor"] < snr["two_level"], snr
    assert abs(snr["two_level"] - snr["token"]) < 1.5, snr


def test_two_level_keeps_groups_that_underflow_under_a_128_scale():
    # the mechanism by which finer local scales win: a group 2^-20 below its 128-block max
    x = heavy_tailed_activations(11)[:, :128].clone()
    x[:, 32:64] *= 2.0 ** -20 / x[:, 32:64].abs().amax(-1, keepdim=True) * x.abs().amax(-1, keepdim=True)
    small = x[:, 32:64]
    snr_small = {}
    for gran in ("tensor", "token", "two_level"):
        dq = dequantize(quantize(x, gran, "fp32"))[:, 32:64]
        snr_small[gran] = float(10 * torch.log10(small.pow(2).sum() / (dq - small).pow(2).sum()))
    assert snr_small["tensor"] < 5 and snr_small["token"] < 5, snr_small  # flushed to (almost) zero
    assert snr_small["two_level"] > 25, snr_small


def test_quant_stats_reports_saturation_underflow_and_snr():
    x = heavy((128, 256), 10)
    x[0, 0] = 1e-12  # underflows under the block's scale
    q = quantize(x, "token")
    st = quant_stats(x, q)
    assert st["amax"] == float(x.abs().max())
    assert 0 < st["underflow"] < 0.05
    assert 0 < st["saturated"] < 0.05  # each block's amax element sits near fmax
    assert 20 < st["snr_db"] < 40


def test_bad_arguments_name_the_fix():
    x = torch.randn(4, 4)
    with pytest.raises(ValueError, match="granularity"):
        quantize(x, "row")
    with pytest.raises(ValueError, match="e4m3"):
        quantize(x, "token", fmt="e4m2")
    with pytest.raises(TypeError, match="floating"):
        quantize(torch.ones(4, 4, dtype=torch.int32), "token")
    with pytest.raises(ValueError, match="re-quantize"):
        quantize(x, "token").t()
