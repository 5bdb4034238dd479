"""The fused FP8 SwiGLU MLP (infir/fp8/mlp.py) against the unfused path it replaces, and its kernels
against the CPU reference."""
import pytest
import torch
import torch._inductor.config

from infir.fp8 import WeightCache, get_recipe
from infir.fp8.formats import get_format
from infir.fp8.mlp import fp8_swiglu_mlp, fusable
from infir.fp8.quantize import QTensor, dequantize, quantize_token_ref
from infir.fp8.swiglu import swiglu_backward, swiglu_fp8_input
from infir.fp8.traced import _quantize_pair, traced_linear

BLOCKWISE = ["fp8_blockwise_ue8m0", "fp8_blockwise_fp32"]


def _unfused(x, w1, w2, recipe, c1, c2):
    h = traced_linear(x, w1, c1.get(w1, recipe), None, recipe)
    return traced_linear(swiglu_fp8_input(h, recipe.scale_format, recipe.fmt), w2, c2.get(w2, recipe), None, recipe)


def _fused(x, w1, w2, recipe, c1, c2):
    return fp8_swiglu_mlp(x, w1, c1.get(w1, recipe), w2, c2.get(w2, recipe), recipe)


def _inputs(device, m=256, hidden=256, ffn=384, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(m, hidden, generator=g) * torch.rand(m, 1, generator=g) * 4).to(device, torch.bfloat16)
    w1 = (torch.randn(2 * ffn, hidden, generator=g) * 0.05).to(device)
    w2 = (torch.randn(hidden, ffn, generator=g) * 0.05).to(device)
    dout = (torch.randn(m, hidden, generator=g) * 1e-3).to(device, torch.bfloat16)
    return x, w1, w2, dout


def _run(fn, recipe, x, w1, w2, dout, compile_backend=None):
    x, w1, w2 = (t.clone().requires_grad_(True) for t in (x, w1, w2))
    c1, c2 = WeightCache(), WeightCache()
    if compile_backend is not None:
        fn = torch.compile(fn, backend=compile_backend, fullgraph=True)
    out = fn(x, w1, w2, recipe, c1, c2)
    out.backward(dout)
    return out.detach(), x.grad, w1.grad, w2.grad


def _assert_equal(ref, got):
    for name, r, g in zip(("out", "dx", "dw1", "dw2"), ref, got):
        assert g.dtype == r.dtype and g.shape == r.shape, name
        assert torch.equal(g, r), (name, int((g != r).sum()), float((g.float() - r.float()).abs().max()))


@pytest.mark.parametrize("recipe", BLOCKWISE)
def test_fused_mlp_equals_the_unfused_layers(recipe):
    """Output and all three gradients bit-equal: the same FP8 operands reach the same GEMMs."""
    recipe = get_recipe(recipe)
    args = _inputs("cpu")
    _assert_equal(_run(_unfused, recipe, *args), _run(_fused, recipe, *args))


def test_fused_mlp_is_one_graph_and_equals_eager_through_inductor():
    torch._dynamo.reset()
    recipe = get_recipe("fp8_blockwise_ue8m0")
    args = _inputs("cpu", m=128, hidden=128, ffn=256, seed=1)
    with torch._inductor.config.patch(emulate_precision_casts=True):
        got = _run(_fused, recipe, *args, compile_backend="inductor")
    _assert_equal(_run(_fused, recipe, *args), got)


def test_ffn_without_whole_blocks_takes_the_reference_path():
    recipe = get_recipe("fp8_blockwise_ue8m0")
    args = _inputs("cpu", m=128, hidden=128, ffn=200)  # 200 % 128 != 0
    _assert_equal(_run(_unfused, recipe, *args), _run(_fused, recipe, *args))


def test_only_per_token_recipes_fuse():
    assert [r for r in ("fp8_blockwise_ue8m0", "fp8_blockwise_fp32", "fp8_tensorwise", "moss")
            if fusable(get_recipe(r))] == BLOCKWISE
    x, w1, w2, _ = _inputs("cpu", m=128, hidden=128, ffn=128)
    recipe = get_recipe("moss")
    with pytest.raises(ValueError, match="per token"):
        fp8_swiglu_mlp(x, w1, WeightCache().get(w1, recipe), w2, WeightCache().get(w2, recipe), recipe)


def _check_kernels(h, dy, scale_format, fmt="e4m3", config=None):
    """Fused kernels == the reference quantizers of the unfused kernels' y and dh, byte for byte (the
    fused kernels round y and dh as those do; y/dh themselves are checked in test_swiglu.py)."""
    from qcheck import assert_same_q

    from infir.fp8.kernels import swiglu as ks

    def pair(t):  # the reference's (q, q^T) in the layouts the kernels write
        q, s, qt, st = _quantize_pair(t.cpu(), "token", scale_format, fmt, True)
        return QTensor(q, s, "token", scale_format, fmt), QTensor(qt, st, "token", scale_format, fmt)

    y, hq_old, hs_old = ks.swiglu_fp8_fwd(h, scale_format, fmt)
    (hq, hs), (q, s, qt, st) = ks.swiglu_quant_fwd(h, scale_format, fmt, config)
    assert_same_q(QTensor(hq, hs, "token", scale_format, fmt), quantize_token_ref(h.cpu(), get_format(fmt), scale_format))
    want_q, want_qt = pair(y)
    assert_same_q(QTensor(q, s, "token", scale_format, fmt), want_q)
    assert_same_q(QTensor(qt, st, "token", scale_format, fmt), want_qt)
    assert s.stride() == (1, s.shape[0]) and st.stride() == (1, st.shape[0])  # scaled_mm's outer-dim-major

    dh = ks.swiglu_fp8_bwd(hq, hs, dy, h.dtype)
    q, s, qt, st = ks.swiglu_quant_bwd(hq, hs, dy, h.dtype, scale_format, fmt, config)
    want_q, want_qt = pair(dh)
    assert_same_q(QTensor(q, s, "token", scale_format, fmt), want_q)
    assert_same_q(QTensor(qt, st, "token", scale_format, fmt), want_qt)
    # and dh itself is the reference gradient at the FP8 copy, to rounding
    ref = swiglu_backward(dequantize(QTensor(hq.cpu(), hs.cpu(), "token", scale_format, fmt)), dy.cpu()).to(h.dtype)
    torch.testing.assert_close(dh.cpu(), ref, rtol=1.6e-2, atol=1e-6)


@pytest.mark.parametrize("scale_format,config", [("ue8m0", None), ("fp32", {"BM_ROWS": 16, "BN": 32, "num_warps": 4})])
def test_fused_kernels_match_the_reference(scale_format, config):
    from qcheck import rand

    h = rand((133, 2 * 256))  # a partial 128-token block: its column scales cover 5 tokens
    h[6, :128] = 0.0  # an all-zero row block
    h[:, 256:384] = 0.0  # an all-zero column of `up` -> y's columns 0..127 all zero
    _check_kernels(h, rand((133, 256)), scale_format, config=config)


def test_fused_kernels_carry_nan_to_the_operands():
    """A NaN in h reaches FC2's operand and dh's (the trainer's non-finite check sees the loss)."""
    from qcheck import rand

    from infir.fp8.kernels import swiglu as ks

    h = rand((128, 256))
    h[9, 3] = float("nan")
    (hq, hs), (q, s, qt, st) = ks.swiglu_quant_fwd(h, "ue8m0", "e4m3")
    assert torch.isnan(s[9]).any() and torch.isnan(st[3]).any()
    q, s, qt, st = ks.swiglu_quant_bwd(hq, hs, rand((128, 128)), h.dtype, "ue8m0", "e4m3")
    assert torch.isnan(s[9]).any()


@pytest.mark.gpu
@pytest.mark.parametrize("scale_format", ["ue8m0", "fp32"])
def test_gpu_fused_kernels_match_the_reference(scale_format):
    from qcheck import rand

    h = rand((4096 + 8, 2 * 8960), device="cuda")
    _check_kernels(h, rand((4096 + 8, 8960), device="cuda"), scale_format)


@pytest.mark.gpu
def test_gpu_every_fused_kernel_configuration_writes_the_same_bits():
    from qcheck import rand

    from infir.fp8.kernels import swiglu as ks

    h, dy = rand((1000, 2 * 1280), device="cuda"), rand((1000, 1280), device="cuda")
    outs = []
    for cfg in ks.FUSED_CONFIGS:
        (hq, hs), fwd = ks.swiglu_quant_fwd(h, "fp32", "e4m3", cfg)
        bwd = ks.swiglu_quant_bwd(hq, hs, dy, h.dtype, "fp32", "e4m3", cfg)
        outs.append([t.view(torch.uint8) if t.element_size() == 1 else t for t in (hq, hs, *fwd, *bwd)])
    for cfg, o in zip(ks.FUSED_CONFIGS[1:], outs[1:]):
        assert all(torch.equal(a, b) for a, b in zip(outs[0], o)), cfg


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", BLOCKWISE)
def test_gpu_fused_mlp_equals_the_unfused_layers_compiled(recipe):
    """On CUDA, both compiled (the training path): Triton kernels and scaled_mm, the same bits."""
    torch._dynamo.reset()
    recipe = get_recipe(recipe)
    args = _inputs("cuda", m=1024, hidden=512, ffn=1280)
    with torch._inductor.config.patch(emulate_precision_casts=True):
        ref = _run(_unfused, recipe, *args, compile_backend="inductor")
        got = _run(_fused, recipe, *args, compile_backend="inductor")
    _assert_equal(ref, got)
