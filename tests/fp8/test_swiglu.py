"""SwiGLU with its input saved in FP8 (infir.fp8.swiglu) against the exact BF16/FP32 SwiGLU."""
from __future__ import annotations

import pytest
import torch

from infir.fp8.formats import get_format
from infir.fp8.policy import policy_override
from infir.fp8.quantize import QTensor, dequantize, quantize_token_ref
from infir.fp8.swiglu import swiglu, swiglu_backward, swiglu_fp8_input


def _h(tokens=64, ffn=320, seed=0):
    g = torch.Generator().manual_seed(seed)
    # outlier columns as SwiGLU inputs grow them in long runs (LLMQ A.4)
    h = torch.randn(tokens, 2 * ffn, generator=g) * torch.linspace(0.1, 4.0, 2 * ffn)
    return h.bfloat16()


def _saved_dtypes(fn, h):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t), t)[1], lambda t: t):
        y = fn(h)
    return y, saved


def test_swiglu_backward_is_the_autograd_gradient():
    h = _h().float().requires_grad_()
    dy = torch.randn(h.shape[0], h.shape[1] // 2, generator=torch.Generator().manual_seed(1))
    swiglu(h).backward(dy)
    torch.testing.assert_close(swiglu_backward(h.detach(), dy), h.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale_format", ["ue8m0", "fp32"])
def test_forward_is_exact_and_backward_reads_the_fp8_copy(scale_format):
    h = _h().requires_grad_()
    dy = torch.randn(h.shape[0], h.shape[1] // 2, generator=torch.Generator().manual_seed(1)).bfloat16()
    y = swiglu_fp8_input(h, scale_format)
    assert torch.equal(y, swiglu(h.detach()))
    y.backward(dy)
    # exactly the SwiGLU gradient at the dequantized input ...
    hq = dequantize(quantize_token_ref(h.detach(), get_format("e4m3"), scale_format))
    assert torch.equal(h.grad, swiglu_backward(hq, dy).bfloat16())
    # ... which is near the exact gradient, and not equal to it (the copy really is FP8)
    exact = swiglu_backward(h.detach(), dy)
    err = (h.grad.float() - exact).norm() / exact.norm()
    assert 1e-4 < err < 0.06, err


def test_saves_one_byte_a_value_instead_of_two():
    h = _h(tokens=256, ffn=512).requires_grad_()
    _, saved = _saved_dtypes(swiglu_fp8_input, h)
    assert {t.dtype for t in saved} == {torch.float8_e4m3fn, torch.float32}
    assert sum(t.numel() * t.element_size() for t in saved) <= h.numel() * (1 + 4 / 128)
    _, plain = _saved_dtypes(swiglu, h)
    assert sum(t.numel() * t.element_size() for t in plain) >= 2 * h.numel()


def test_non_finite_input_reaches_the_gradient():
    """A NaN in h must show up in dh (the trainer's non-finite check), not be rounded away."""
    h = _h().requires_grad_()
    with torch.no_grad():
        h[3, 7] = float("nan")
    swiglu_fp8_input(h).sum().backward()
    assert torch.isnan(h.grad[3]).any()


def test_compiled_matches_eager():
    h = _h(tokens=32, ffn=256)
    dy = torch.randn(32, 256, generator=torch.Generator().manual_seed(2)).bfloat16()
    grads = []
    for fn in (swiglu_fp8_input, torch.compile(swiglu_fp8_input, fullgraph=True)):
        x = h.clone().requires_grad_()
        y = fn(x)
        y.backward(dy)
        grads.append((y.detach(), x.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-2, atol=1e-2)


def test_non_finite_input_reaches_the_kernels_gradient():
    """The kernels' twin of test_non_finite_input_reaches_the_gradient (test_kernel_pairs.py holds their
    values to the reference): a NaN in h gives its block a NaN scale, and dh a NaN."""
    from qcheck import rand

    from infir.fp8.kernels import swiglu as ks

    h, dy = rand((37, 2 * 256)), rand((37, 256))
    h[9, 130] = float("nan")
    _, q, s = ks.swiglu_fp8_fwd(h, "ue8m0", "e4m3")
    assert torch.isnan(ks.swiglu_fp8_bwd(q, s, dy, h.dtype)[9]).any()


def test_shapes_without_whole_blocks_take_the_reference_path():
    h = _h(tokens=8, ffn=200).requires_grad_()  # 200 % 128 != 0
    swiglu_fp8_input(h).sum().backward()
    assert torch.isfinite(h.grad).all()


@pytest.mark.parametrize("ffn", [352, 384])
def test_compiled_equals_eager_when_the_width_is_not_whole_blocks(ffn):
    """Under inductor the reference path (CPU, or widths the kernels do not take) gives the eager
    gradient bit for bit, including the last, partial 1x128 block (at ffn=352 it once did not)."""
    h, dy = _h(ffn=ffn), torch.randn(64, ffn, generator=torch.Generator().manual_seed(2)).bfloat16()

    def grad(fn):
        x = h.clone().requires_grad_(True)
        fn(x).backward(dy)
        return x.grad

    torch._dynamo.reset()
    assert torch.equal(grad(torch.compile(swiglu_fp8_input, backend="inductor", fullgraph=True)), grad(swiglu_fp8_input))


def _fused_reference(q, s, dy, h_scale_format, h_fmt, scale_format, fmt):
    """What the fused kernel must give: dh from the dequantized copy (swiglu_backward, FP32 op by op,
    on the kernel's device), rounded to bf16, then the reference token quantizer in both layouts."""
    from infir.fp8.quantize import quantize_reference

    h = dequantize(QTensor(q, s, "token", h_scale_format, h_fmt))
    dh = swiglu_backward(h, dy).bfloat16()
    return dh, quantize_reference(dh.cpu(), "token", scale_format, fmt), quantize_reference(dh.cpu().t(), "token",
                                                                                               scale_format, fmt)


def _assert_nearly_same_q(got, ref, max_frac=1e-4):
    """The fused kernel's sigmoid uses the fast exp and division (2 ulp), so after the bf16 and FP8
    roundings a rare byte (and, rarer, a power-of-two scale) may differ from the reference's; the
    rest must be equal. A byte that differs may be one FP8 step off, not more."""
    gb, rb = got.data.view(torch.uint8).cpu(), ref.data.view(torch.uint8).cpu()
    frac = (gb != rb).float().mean().item()
    assert frac <= max_frac, f"{frac:.2e} of the FP8 bytes differ"
    sg, sr = got.scale.cpu(), ref.scale.cpu()
    assert ((sg != sr) & ~(sg.isnan() & sr.isnan())).float().mean().item() <= 10 * max_frac, "scales differ"
    # adjacent codes of one sign are adjacent integers: "one FP8 step" is a difference of 1 where the scales agree
    same_scale = (sg == sr).repeat_interleave(128, dim=-1)[..., : gb.shape[-1]]
    codes = (gb.int() - rb.int()).abs()
    assert (codes[same_scale] <= 1).all(), "a differing byte is more than one FP8 step off"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8192, 8960), (256, 4864), (1152, 128)])
def test_gpu_fused_backward_quantizer_matches_the_reference(shape):
    """kernels/quant_both.cu's SwiGLU backward + both-layouts quantizer against the reference (dh from
    the dequantized copy in FP32, bf16, then the token quantizer): every scale format, FP8 format of
    the output and of the saved h, heavy-tailed inputs, a row-strided dY, both loads variants; all
    but a rare byte equal (_assert_nearly_same_q). With an all-zero block, NaN and infinities in dY:
    the same NaN positions and zeros. The allocator is first filled with 0x7F so that a skipped store shows."""
    from qcheck import rand

    from infir.fp8.kernels import cuda_build
    from infir.fp8.kernels import swiglu as ks
    from infir.fp8.swiglu import fused_backward_quantize_ok, swiglu_fp8_backward_quantized

    assert cuda_build.load("quant_both", torch.device("cuda")) is not None, "quant_both.cu did not build here"
    garbage = torch.full((1 << 28,), 0x7F, dtype=torch.uint8, device="cuda")
    del garbage
    m, f = shape
    h = rand((m, 2 * f), device="cuda")
    wide = rand((m, f + 128), device="cuda")
    for h_sf, h_fmt in (("ue8m0", "e4m3"), ("fp32", "e5m2")):
        _, q, s = ks.swiglu_fp8_fwd(h, h_sf, h_fmt)
        for dy in (wide[:, :f], wide[:, 128:]):
            assert fused_backward_quantize_ok(q, dy, torch.bfloat16)
            for sf in ("ue8m0", "fp32"):
                for fmt in ("e4m3", "e5m2"):
                    _, ref, ref_t = _fused_reference(q, s, dy, h_sf, h_fmt, sf, fmt)
                    for loads in (2, 4):
                        got = ks.swiglu_fp8_bwd_quant(q, s, dy, sf, fmt, loads)
                        _assert_nearly_same_q(QTensor(got[0], got[1], "token", sf, fmt), ref)
                        _assert_nearly_same_q(QTensor(got[2], got[3], "token", sf, fmt), ref_t)
    _, q, s = ks.swiglu_fp8_fwd(h, "ue8m0", "e4m3")
    dy = wide[:, :f].contiguous()
    dy[:128, :128] = 0  # dgate and dup both all-zero blocks
    dy[130, 3], dy[131, 5], dy[200, 7] = float("nan"), float("inf"), -float("inf")
    got = swiglu_fp8_backward_quantized(q, s, dy, "ue8m0", "e4m3")
    _, ref, ref_t = _fused_reference(q, s, dy, "ue8m0", "e4m3", "ue8m0", "e4m3")
    for g, r in zip((QTensor(got[0], got[1], "token"), QTensor(got[2], got[3], "token")), (ref, ref_t)):
        dg, dr = dequantize(g).cpu(), dequantize(r)
        assert torch.equal(torch.isnan(dg), torch.isnan(dr)) and torch.isnan(dr).any()
    rows, cols = dequantize(QTensor(got[0], got[1], "token")).cpu(), dequantize(QTensor(got[2], got[3], "token")).cpu()
    assert (rows[:128, :128] == 0).all() and (rows[:128, f:f + 128] == 0).all()
    assert (cols[:128, :128] == 0).all() and (cols[f:f + 128, :128] == 0).all()


@pytest.mark.gpu
def test_gpu_fused_backward_quantizer_falls_back_without_the_cuda_library():
    """With the CUDA kernels off (INFIR_CUDA_KERNELS=0, or no nvcc) the op runs the unfused pair,
    Triton's SwiGLU backward then the Triton quantizer, and still matches the reference."""
    from qcheck import rand

    from infir.fp8.kernels import cuda_build
    from infir.fp8.kernels import swiglu as ks

    h, dy = rand((256, 2 * 384), device="cuda"), rand((256, 384), device="cuda")
    _, q, s = ks.swiglu_fp8_fwd(h, "ue8m0", "e4m3")
    with policy_override(cuda_kernels=False):
        assert cuda_build.load("quant_both", torch.device("cuda")) is None
        got = ks.swiglu_fp8_bwd_quant(q, s, dy, "ue8m0", "e4m3")
    _, ref, ref_t = _fused_reference(q, s, dy, "ue8m0", "e4m3", "ue8m0", "e4m3")
    _assert_nearly_same_q(QTensor(got[0], got[1], "token"), ref)
    _assert_nearly_same_q(QTensor(got[2], got[3], "token"), ref_t)


def _fused_forward_reference(h, h_scale_format, h_fmt, scale_format, fmt):
    """What the fused forward must give: h's token quantization (bit for bit), and y = swiglu(h) in
    h's dtype (torch's ops), then the reference token quantizer in both layouts."""
    from infir.fp8.quantize import quantize_reference

    y = swiglu(h).cpu()
    return (quantize_token_ref(h.cpu(), get_format(h_fmt), h_scale_format),
            quantize_reference(y, "token", scale_format, fmt), quantize_reference(y.t(), "token", scale_format, fmt))


def _check_fused_forward(got, h, h_sf, h_fmt, sf, fmt):
    qh, sh, q, s, qt, st = got
    ref_h, ref, ref_t = _fused_forward_reference(h, h_sf, h_fmt, sf, fmt)
    assert torch.equal(qh.view(torch.uint8).cpu(), ref_h.data.view(torch.uint8)), "h's FP8 copy differs"
    torch.testing.assert_close(sh.cpu(), ref_h.scale, rtol=0, atol=0, equal_nan=True)
    _assert_nearly_same_q(QTensor(q, s, "token", sf, fmt), ref)
    _assert_nearly_same_q(QTensor(qt, st, "token", sf, fmt), ref_t)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8192, 4864), (256, 8960), (1152, 128)])
def test_gpu_fused_forward_quantizer_matches_the_reference(shape):
    """kernels/quant_both.cu's SwiGLU forward + both-layouts quantizer of y (FC2's operands), with h's
    FP8 copy written on the way: that copy equal to the token quantizer's bit for bit, y's operands
    all but a rare byte (the fast exp and division), for every scale and FP8 format of y and of h, a
    row-strided h, both loads variants; NaN, infinities and an all-zero block in h give the
    reference's NaN positions and zeros. The allocator is first filled with 0x7F so that a skipped store shows."""
    from qcheck import rand

    from infir.fp8.kernels import cuda_build
    from infir.fp8.kernels import swiglu as ks
    from infir.fp8.swiglu import fused_forward_quantize_ok, swiglu_fp8_forward_quantized

    assert cuda_build.load("quant_both", torch.device("cuda")) is not None, "quant_both.cu did not build here"
    garbage = torch.full((1 << 28,), 0x7F, dtype=torch.uint8, device="cuda")
    del garbage
    m, f = shape
    wide = rand((m, 2 * f + 128), device="cuda")
    for h in (wide[:, : 2 * f], wide[:, 128:].contiguous()):
        assert fused_forward_quantize_ok(h)
        for h_sf, h_fmt in (("ue8m0", "e4m3"), ("fp32", "e5m2")):
            for sf in ("ue8m0", "fp32"):
                for fmt in ("e4m3", "e5m2"):
                    for loads in (2, 4):
                        _check_fused_forward(ks.swiglu_fp8_fwd_quant(h, h_sf, h_fmt, sf, fmt, loads), h, h_sf, h_fmt,
                                             sf, fmt)
    h = wide[:, : 2 * f].contiguous()
    h[:128, :128] = 0  # gate's block 0 all zero: y's too
    h[130, 3], h[131, f + 5], h[200, 7] = float("nan"), float("inf"), -float("inf")
    qh, sh, q, s, qt, st = swiglu_fp8_forward_quantized(h, "ue8m0", "e4m3", "ue8m0", "e4m3")
    _, ref, ref_t = _fused_forward_reference(h, "ue8m0", "e4m3", "ue8m0", "e4m3")
    for g, r in zip((QTensor(q, s, "token"), QTensor(qt, st, "token")), (ref, ref_t)):
        dg, dr = dequantize(g).cpu(), dequantize(r)
        assert torch.equal(torch.isnan(dg), torch.isnan(dr)) and torch.isnan(dr).any()
    assert (dequantize(QTensor(q, s, "token")).cpu()[:128, :128] == 0).all()
    assert (dequantize(QTensor(qt, st, "token")).cpu()[:128, :128] == 0).all()


@pytest.mark.gpu
def test_gpu_fused_forward_quantizer_falls_back_without_the_cuda_library():
    """With the CUDA kernels off (INFIR_CUDA_KERNELS=0) the op runs Triton's SwiGLU forward, then the
    Triton quantizer."""
    from qcheck import rand

    from infir.fp8.kernels import cuda_build
    from infir.fp8.kernels import swiglu as ks

    h = rand((256, 2 * 384), device="cuda")
    with policy_override(cuda_kernels=False):
        assert cuda_build.load("quant_both", torch.device("cuda")) is None
        got = ks.swiglu_fp8_fwd_quant(h, "ue8m0", "e4m3", "ue8m0", "e4m3")
    _check_fused_forward(got, h, "ue8m0", "e4m3", "ue8m0", "e4m3")
