"""The quantization kernels against the PyTorch reference where the registry's one pair per kernel
(test_kernel_pairs.py) does not reach: fresh random inputs of edge shapes, special values (zeros,
subnormals, NaN, infinities), every configuration autotuning may pick, the software FP8 cast against
the hardware one, and on a GPU memory left full of NaN bytes (a skipped store shows).

On CPU the kernels run in Triton's interpreter (tests/fp8/conftest.py) with the software FP8
rounding; the `gpu` tests run the compiled kernels with the hardware cast on full sizes.
"""
import itertools

import pytest
import torch
import triton
import triton.language as tl

from infir.fp8 import dequantize, fp8_gemm, quantize
from infir.fp8 import kernels as kn
from infir.fp8.kernels.triton_fp8 import cast_fp8
from infir.fp8.quantize import fold_two_level, quantize_reference
from qcheck import assert_same_q, rand

GRANS = ["tensor", "token", "block", "two_level"]


def check_all(x):
    for gran in GRANS:
        for sf in ("ue8m0", "fp32"):
            for fmt in ("e4m3", "e5m2"):
                assert_same_q(quantize(x, gran, sf, fmt, impl="triton"), quantize_reference(x, gran, sf, fmt))


@pytest.mark.parametrize("shape", [(1, 1), (130, 257), (37, 160), (200, 96)])
def test_quantize_kernels_match_reference_bitwise(shape):
    check_all(rand(shape))


def test_kernels_match_reference_on_special_values():
    x = rand((150, 200), dtype=torch.float32)
    x[:130, :130] = 0  # zero blocks / groups / tokens
    x[140, 3] = 1e-40  # float32 subnormal
    x[141, 5] = float("nan")
    x[142, 150] = float("inf")
    x[143, 199] = -float("inf")
    for gran in ("token", "block", "two_level"):
        t, r = quantize(x, gran, impl="triton"), quantize_reference(x, gran)
        assert torch.equal(torch.isnan(t.scale), torch.isnan(r.scale))
        assert torch.equal(torch.isnan(dequantize(t)), torch.isnan(dequantize(r)))
        fin = ~torch.isnan(dequantize(r))
        assert torch.equal(dequantize(t)[fin], dequantize(r)[fin])


def check_token_layouts(x, every_config=True):
    """Every kernel configuration autotuning may pick gives the reference's bits."""
    from infir.fp8.kernels.autotune import BOTH_CONFIGS, COLS_CONFIGS

    xc = x.cpu()
    ref, ref_t = quantize_reference(xc, "token"), quantize_reference(xc.t(), "token")
    for cfg in BOTH_CONFIGS if every_config else []:
        q, qt = kn.quantize_token_triton(x, rows=True, cols=True, config=cfg)
        assert_same_q(q, ref)
        assert_same_q(qt, ref_t)
    for cfg in COLS_CONFIGS if every_config else []:
        assert_same_q(kn.quantize_token_triton(x, rows=False, cols=True, config=cfg)[1], ref_t)
    q, qt = kn.quantize_token_triton(x, rows=True, cols=True)  # the default (autotuned on a GPU)
    assert_same_q(q, ref)
    assert_same_q(qt, ref_t)


def test_token_kernels_give_both_layouts_in_every_config():
    check_token_layouts(rand((200, 300)))


def test_tensor_kernel_given_scale_records_amax():
    x = rand((100, 70), dtype=torch.float32)
    seen = torch.zeros(())
    q, _ = kn.quantize_tensor_triton(x, "fp32", scale=torch.tensor(0.37), record_amax=seen)
    assert float(seen) == float(x.abs().max())


# ------------------------------------------------------------------- GPU (compiled kernels, full sizes)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 8192), (4097, 3583), (1000, 18944), (129, 127)])
def test_gpu_kernels_match_reference_bitwise(shape):
    # the reference runs on the CPU: its IEEE division is the source of truth
    x = rand(shape, device="cuda")
    xc = x.cpu()
    small = shape[0] * shape[1] < 2**24
    for gran in GRANS:
        for sf in ("ue8m0", "fp32"):
            for fmt in ("e4m3", "e5m2") if small else ("e4m3",):
                assert_same_q(quantize(x, gran, sf, fmt, impl="triton"), quantize_reference(xc, gran, sf, fmt))
    check_token_layouts(x, every_config=shape == (4097, 3583))  # each config compiles once: one shape is enough
    assert_same_q(kn.quantize_block_triton(x).t(), quantize_reference(xc, "block").t())
    assert_same_q(kn.quantize_two_level_triton(x, "fp32", fold=True),
                  fold_two_level(quantize_reference(xc, "two_level", "fp32")))


@triton.jit
def _cast_both_ways_kernel(x_ptr, hw_ptr, sw_ptr, N, FMAX: tl.constexpr, HW: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(hw_ptr + offs, cast_fp8(x, FMAX, HW), mask=m)
    tl.store(sw_ptr + offs, cast_fp8(x, FMAX, tl.uint8), mask=m)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_gpu_software_fp8_cast_equals_hardware_cast(fmt):
    """The integer rounding the interpreted kernels write FP8 with (triton_fp8.fp8_bits_rne, through
    cast_fp8's uint8 output) gives the hardware cast's bytes, compiled, on values across the format's
    range: normals, subnormals, ties, saturation and NaN."""
    from infir.fp8.formats import get_format
    from infir.fp8.kernels.triton_fp8 import TL_DTYPE

    f = get_format(fmt)
    n = 1 << 20
    x = rand((n,), device="cuda", dtype=torch.float32) * torch.exp2(torch.randint(-20, 12, (n,), device="cuda").float())
    x[:4] = torch.tensor([float("nan"), 1e30, -1e30, -0.0])
    hw = torch.empty(x.shape, dtype=f.dtype, device="cuda")
    sw = torch.empty(x.shape, dtype=torch.uint8, device="cuda")
    _cast_both_ways_kernel[(triton.cdiv(n, 1024),)](x, hw, sw, n, FMAX=f.max, HW=TL_DTYPE[fmt], BLOCK=1024)
    assert torch.equal(hw.view(torch.uint8), sw)


def _close(got, ref, tol):
    err = float((got.float() - ref.float()).norm() / ref.float().norm())
    assert err < tol, err


@pytest.mark.gpu
@pytest.mark.parametrize("mkn", [(8192, 1536, 8960), (256, 8960, 1536), (1024, 3584, 512)])
def test_gpu_scaled_mm_matches_emulated(mkn):
    M, K, N = mkn
    x, w, g = rand((M, K), "cuda"), rand((N, K), "cuda"), rand((M, N), "cuda")
    qx, qxt = kn.quantize_token_triton(x, rows=True, cols=True)
    qw = kn.quantize_block_triton(w)
    qwt = qw.t()
    qg, qgt = kn.quantize_token_triton(g, rows=True, cols=True)
    for a, b in ((qx, qw), (qg, qwt), (qgt, qxt)):  # fprop, dgrad, wgrad
        for dt in (torch.bfloat16, torch.float32):
            # FP8 tensor-core accumulation is not a full FP32 one: ~1e-4 relative seen on an H100
            _close(fp8_gemm(a, b, dt, backend="scaled_mm"), fp8_gemm(a, b, torch.float32, backend="emulated"), 1e-2 if dt == torch.bfloat16 else 1e-3)
    tx, _ = kn.quantize_tensor_triton(x)
    tw, _ = kn.quantize_tensor_triton(w)
    _close(fp8_gemm(tx, tw, backend="scaled_mm"), fp8_gemm(tx, tw, backend="emulated"), 1e-2)
    rx = kn.quantize_two_level_triton(x, fold=True)  # MOSS: folded rows x per-tensor / folded rows
    rw = kn.quantize_two_level_triton(w, fold=True)
    for b in (tw, rw):
        for dt in (torch.bfloat16, torch.float32):
            _close(fp8_gemm(rx, b, dt, backend="scaled_mm"), fp8_gemm(rx, b, torch.float32, backend="emulated"), 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(256, 384), (1536, 8960), (4864, 896)])
def test_transposed_operands_equal_the_cpu_reference_gpu(shape):
    """dgrad's W^T (the GPU weight quantization, transposed) and a per-tensor X^T equal the CPU
    reference's bytes at Qwen shapes.

    An in-kernel transposed store once skipped elements on an H100, leaving whatever the allocator
    held (NaN codes in every dgrad); the caching allocator is first filled with 0x7F (E4M3 NaN) so
    that a skipped store shows here instead of hiding behind zeroed fresh memory.
    """
    garbage = torch.full((1 << 28,), 0x7F, dtype=torch.uint8, device="cuda")
    del garbage
    w = torch.randn(*shape) * 0.05
    for sf in ("ue8m0", "fp32"):
        assert_same_q(kn.quantize_block_triton(w.cuda(), sf).t(), quantize_reference(w, "block", sf).t())
    _, xt = kn.quantize_tensor_triton(w.cuda(), "fp32", transpose=True)
    assert_same_q(xt, quantize_reference(w, "tensor", "fp32").t())


def _every_transpose_config(x):
    from infir.fp8.kernels import transpose as tr

    ref = x.t().contiguous()
    for cfg in tr.CONFIGS:
        got = tr.runner(x, cfg)(x)
        assert got.shape == ref.shape and got.is_contiguous(), cfg
        assert torch.equal(got.view(torch.uint8).cpu() if got.element_size() == 1 else got.cpu(),
                           ref.view(torch.uint8).cpu() if ref.element_size() == 1 else ref.cpu()), cfg


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float32])
def test_transpose_kernel_equals_torch_in_every_config(dtype):
    """The backward's transposes (W^T, per-tensor X^T, MOSS X^T) by kernels.transpose_2d, in every
    configuration autotuning may pick: the same bytes as torch's, at shapes with partial tiles, and
    from a row-strided view (stride(0) > C)."""
    for shape in [(1, 1), (130, 257), (37, 160), (256, 128)]:
        _every_transpose_config(rand(shape).to(dtype))
    wide = rand((70, 300)).to(dtype)
    _every_transpose_config(wide[:, 13:213])
    assert torch.equal(kn.transpose_2d(wide[:, :200]).float(), wide[:, :200].t().float())
    with pytest.raises(ValueError, match="2-D tensor"):
        kn.transpose_2d(wide[None])


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1536, 8960), (4864, 896), (8192, 1536), (4097, 3583)])
def test_transpose_kernel_equals_torch_gpu(shape):
    """As on CPU, compiled, at Qwen weight and activation shapes, every configuration, after the
    allocator was filled with 0x7F bytes (a skipped store would leave them)."""
    garbage = torch.full((1 << 28,), 0x7F, dtype=torch.uint8, device="cuda")
    del garbage
    x = rand(shape, device="cuda")
    _every_transpose_config(x.to(torch.float8_e4m3fn))
    _every_transpose_config(x)


def extreme_values(x):
    """x (at least 256 x 256) with finite values where shortcuts break: -0s, a 128x128 tile at 2^-120
    (its amax / 448 is a float32 subnormal: the scale's slow path), one at 2^-117 (the last tile
    of the UE8M0 scale's fast path), one at 2^100, a zero tile with one -0 row."""
    y = x.clone()
    y[7, ::3] = -0.0
    y[:128, :128] *= 2.0**-120
    y[:128, 128:256] *= 2.0**-117
    y[128:256, :128] *= 2.0**100
    y[128:256, 128:256] = 0.0
    y[130, 128:256] = -0.0
    return y


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_gpu_token_kernels_equal_the_cpu_reference_on_extreme_values(fmt):
    """The Triton token quantizers, bytes and scales, where random data never goes: signed zeros
    (the FP32-scale quotient once gave +0 for -0 compiled, never interpreted), subnormal scales."""
    from infir.fp8.kernels.autotune import BOTH_CONFIGS, TRITON_BOTH

    x = extreme_values(rand((512, 640), device="cuda"))
    xc = x.cpu()
    for sf in ("ue8m0", "fp32"):
        ref, ref_t = quantize_reference(xc, "token", sf, fmt), quantize_reference(xc.t(), "token", sf, fmt)
        assert_same_q(kn.quantize_token_triton(x, sf, fmt)[0], ref)
        assert_same_q(kn.quantize_token_triton(x, sf, fmt, rows=False, cols=True)[1], ref_t)
        for cfg in (TRITON_BOTH, BOTH_CONFIGS[0]):  # the split and the fused tile
            q, qt = kn.quantize_token_triton(x, sf, fmt, rows=True, cols=True, config=cfg)
            assert_same_q(q, ref)
            assert_same_q(qt, ref_t)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8192, 1536), (256, 18944), (1024, 4608)])
def test_gpu_cuda_both_layouts_kernel_equals_the_cpu_reference(shape):
    """quant_both.cu (built by nvcc on first use) gives the reference's bytes in both layouts, in
    each of its variants, every scale format and FP8 format, on special values (zero tiles, a
    subnormal, NaN, +-inf) and from a row-strided view; the allocator is first filled with 0x7F
    so that a skipped store shows."""
    from infir.fp8.kernels.cuda_lib import cuda_both_ok

    garbage = torch.full((1 << 28,), 0x7F, dtype=torch.uint8, device="cuda")
    del garbage
    x = rand(shape, device="cuda")
    assert cuda_both_ok(x), "quant_both.cu did not build here: is nvcc on PATH (or CUDA_HOME set)?"
    xc = x.cpu()
    for loads in (4, 8):
        for sf in ("ue8m0", "fp32"):
            for fmt in ("e4m3", "e5m2"):
                q, qt = kn.quantize_token_triton(x, sf, fmt, rows=True, cols=True, config={"CUDA": True, "LOADS": loads})
                assert_same_q(q, quantize_reference(xc, "token", sf, fmt))
                assert_same_q(qt, quantize_reference(xc.t(), "token", sf, fmt))
    finite = extreme_values(x)
    for loads in (4, 8):
        for sf in ("ue8m0", "fp32"):
            for fmt in ("e4m3", "e5m2"):
                q, qt = kn.quantize_token_triton(finite, sf, fmt, rows=True, cols=True,
                                                 config={"CUDA": True, "LOADS": loads})
                assert_same_q(q, quantize_reference(finite.cpu(), "token", sf, fmt))
                assert_same_q(qt, quantize_reference(finite.cpu().t(), "token", sf, fmt))
    special = x.clone()
    special[:128, :256] = 0
    special[130, 3], special[131, 5], special[200, 150], special[201, 199] = 1e-40, float("nan"), float("inf"), -float("inf")
    for sf in ("ue8m0", "fp32"):
        got = kn.quantize_token_triton(special, sf, rows=True, cols=True, config={"CUDA": True, "LOADS": 8})
        ref = (quantize_reference(special.cpu(), "token", sf), quantize_reference(special.cpu().t(), "token", sf))
        for g, r in zip(got, ref):
            assert torch.equal(torch.isnan(g.scale.cpu()), torch.isnan(r.scale))
            dg, dr = dequantize(g).cpu(), dequantize(r)
            assert torch.equal(torch.isnan(dg), torch.isnan(dr))
            assert torch.equal(dg[~torch.isnan(dr)], dr[~torch.isnan(dr)])
    wide = rand((shape[0], shape[1] + 128), device="cuda")[:, 128:]  # rows longer than K, 16-byte aligned
    assert cuda_both_ok(wide)
    q, qt = kn.quantize_token_triton(wide, rows=True, cols=True, config={"CUDA": True, "LOADS": 8})
    assert_same_q(q, quantize_reference(wide.cpu(), "token"))
    assert_same_q(qt, quantize_reference(wide.cpu().t(), "token"))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 8192), (64, 3584), (37, 18944), (300, 96)])
def test_gpu_cuda_two_level_kernel_equals_the_cpu_reference(shape):
    """quant_two_level.cu gives the reference's bytes, scales and E8M0 codes (and its fold), in
    every scale and FP8 format, on special values and from a row-strided view, after the
    allocator was filled with 0x7F. The shapes take each of its kernels (rows in registers, 1, 2
    or 4 vectors a thread, and in shared memory); the tiny rows and groups take its division's
    slow path (a scale below 2^-90), the -0s its sign rule."""
    from infir.fp8.kernels.cuda_lib import cuda_two_level_ok

    garbage = torch.full((1 << 28,), 0x7F, dtype=torch.uint8, device="cuda")
    del garbage
    x = rand(shape, device="cuda")
    assert cuda_two_level_ok(x), "quant_two_level.cu did not build here: is nvcc on PATH (or CUDA_HOME set)?"
    xc = x.cpu()
    for sf in ("ue8m0", "fp32"):
        for fmt in ("e4m3", "e5m2"):
            ref = quantize_reference(xc, "two_level", sf, fmt)
            assert_same_q(kn.quantize_two_level_triton(x, sf, fmt, impl="cuda"), ref)
            assert_same_q(kn.quantize_two_level_triton(x, sf, fmt, fold=True, impl="cuda"), fold_two_level(ref))
    special = x.clone()
    special[0, :64] = 0
    special[1, 3], special[2, 5], special[3, 7], special[4, 9] = 1e-40, float("nan"), float("inf"), -float("inf")
    special[5, 32:64] *= 1e-32  # one group far below its row's amax
    special[6] *= 1e-30  # a whole row near the bottom of bf16's range
    special[7, ::3] = -0.0
    for sf, fmt, fold in itertools.product(("ue8m0", "fp32"), ("e4m3", "e5m2"), (False, True)):
        got = kn.quantize_two_level_triton(special, sf, fmt, fold=fold, impl="cuda")
        ref = quantize_reference(special.cpu(), "two_level", sf, fmt)
        finite = ~torch.isnan(ref.global_scale).reshape(-1)  # rows with no inf/NaN: every byte, -0s too
        if fold:
            ref = fold_two_level(ref)
        else:
            assert torch.equal(got.local_exp.cpu(), ref.local_exp)
        assert torch.equal(got.data.view(torch.uint8).cpu()[finite], ref.data.view(torch.uint8)[finite]), (sf, fmt, fold)
        dg, dr = dequantize(got).cpu(), dequantize(ref)
        assert torch.equal(torch.isnan(dg), torch.isnan(dr)) and torch.equal(dg[~torch.isnan(dr)], dr[~torch.isnan(dr)])
    wide = rand((shape[0], shape[1] + 64), device="cuda")[:, 64:]
    assert cuda_two_level_ok(wide)
    assert_same_q(kn.quantize_two_level_triton(wide, impl="cuda"), quantize_reference(wide.cpu(), "two_level", "fp32"))


def test_scaled_mm_misfits_name_each_size_that_keeps_a_gemm_off_it():
    """The auto backend's fallback warning says which of M, N and K is not the multiple scaled_mm needs, as a
    small model's per-TP-rank width (576 = 1152 / 2) is not a multiple of 128."""
    from infir.fp8.gemm import scaled_mm_fits, scaled_mm_misfits

    tokens = quantize(rand((4096, 896)), "token")
    assert scaled_mm_misfits(tokens, quantize(rand((1024, 896)), "block")) == []
    assert scaled_mm_fits(tokens, quantize(rand((1024, 896)), "block"))
    assert scaled_mm_misfits(tokens, quantize(rand((576, 896)), "block")) == ["N=576 (needs a multiple of 128)"]
    odd = quantize(rand((4100, 448)), "token")
    assert scaled_mm_misfits(odd, quantize(rand((896, 448)), "block")) == [
        "K=448 (needs a multiple of 128)", "M=4100 (needs a multiple of 16)"]
    assert scaled_mm_misfits(quantize(rand((64, 40)), "tensor"), quantize(rand((32, 40)), "tensor")) == [
        "K=40 (needs a multiple of 16)"]
    assert scaled_mm_misfits(tokens, quantize(rand((896, 4096)), "tensor")) == ["granularities ('token', 'tensor')"]
