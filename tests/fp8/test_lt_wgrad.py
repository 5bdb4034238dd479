"""The wgrad GEMM through cuBLASLt (kernels/lt_wgrad) against torch's scaled_mm, on Hopper."""
import pytest
import torch

from infir.fp8.dispatch import quantize_pair
from infir.fp8.gemm import fp8_gemm, fp8_gemm_accumulate, outer_dim_major, scaled_mm_blockwise
from infir.fp8.quantize import QTensor

pytestmark = pytest.mark.gpu

# (tokens, K, N): the wgrad product dW [N, K] = dY^T [N, tokens] @ X^T [K, tokens]^T; small and awkward
# (one 128-token block, N not a multiple of 128) and a Qwen2.5-1.5B projection
SHAPES = [(128, 256, 144), (384, 640, 1024), (8192, 1536, 2048)]


def _operands(tokens, k, n, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, k, device="cuda", generator=g).to(torch.bfloat16)
    dy = (torch.randn(tokens, n, device="cuda", generator=g) * 1e-3).to(torch.bfloat16)
    _, qxt = quantize_pair(x, "token", "ue8m0", "e4m3", rows=False, cols=True)
    _, qdyt = quantize_pair(dy, "token", "ue8m0", "e4m3", rows=False, cols=True)
    return qdyt, qxt


def _torch_scaled_mm(qa, qb, dtype):
    """torch's own blockwise scaled_mm, bypassing infir's cuBLASLt path."""
    import torch.nn.functional as F

    bw = F.ScalingType.BlockWise1x128
    sw = F.SwizzleType.NO_SWIZZLE
    return F.scaled_mm(qa.data, qb.data.t(), outer_dim_major(qa.scale), bw, outer_dim_major(qb.scale), bw,
                       swizzle_a=sw, swizzle_b=sw, output_dtype=dtype)


@pytest.fixture(autouse=True)
def _needs_sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuBLASLt blockwise FP8 needs an sm90 GPU")


@pytest.mark.parametrize("shape", SHAPES)
def test_every_lt_algorithm_gives_torchs_product(shape):
    """Each unsplit algorithm of the plan gives the same bits (so picking the fastest changes no
    result), and those are torch's scaled_mm's up to its own choice of algorithm (a split-K one would
    round differently): FP32 and BF16 out, and accumulated into FP32 in place bit for bit as the sum
    of the FP32 product and the buffer."""
    from infir.fp8.kernels.lt_wgrad import algo_count, lt_wgrad

    qa, qb = _operands(*shape)
    sa, sb = outer_dim_major(qa.scale), outer_dim_major(qb.scale)
    n_algos = algo_count(qa.data, qb.data)
    assert n_algos >= 1
    ref = _torch_scaled_mm(qa, qb, torch.float32)
    outs = [lt_wgrad(qa.data, sa, qb.data, sb, torch.float32, algo=i) for i in range(n_algos)]
    for o in outs[1:]:
        assert torch.equal(o, outs[0])
    torch.testing.assert_close(outs[0], ref, rtol=1e-6, atol=1e-6 * float(ref.abs().max()))
    bf16 = lt_wgrad(qa.data, sa, qb.data, sb, torch.bfloat16)
    torch.testing.assert_close(bf16, _torch_scaled_mm(qa, qb, torch.bfloat16), rtol=8e-3, atol=0)
    c0 = torch.randn(ref.shape, device="cuda")
    for i in range(n_algos):
        acc = c0.clone()
        assert lt_wgrad(qa.data, sa, qb.data, sb, accumulate=acc, algo=i) is acc
        assert torch.equal(acc, c0 + outs[0])


def test_gemm_entry_points_agree_with_the_lt_path():
    """fp8_gemm (token x token) goes through cuBLASLt, fp8_gemm_accumulate adds in place bit for bit as
    the sum, and the emulated backend's (exact FP32 products) agrees to the FP8 tensor cores' own
    accumulation error inside each 128-block (~1e-4 of the largest value)."""
    qa, qb = _operands(*SHAPES[1])
    sa, sb = outer_dim_major(qa.scale), outer_dim_major(qb.scale)
    got = fp8_gemm(qa, qb, torch.float32)
    assert torch.equal(got, scaled_mm_blockwise(qa.data, sa, qb.data, sb, "token", torch.float32))
    c0 = torch.randn(got.shape, device="cuda")
    acc = c0.clone()
    fp8_gemm_accumulate(qa, qb, acc)
    assert torch.equal(acc, c0 + got)
    emulated = c0.clone()
    fp8_gemm_accumulate(qa, qb, emulated, backend="emulated")
    torch.testing.assert_close(emulated, acc, rtol=0, atol=2e-3 * float(got.abs().max()))


def test_strided_rows_are_read_in_place():
    """Columns of a wider A (one rank's tokens of the sequence-parallel split wgrad) give the bits of their
    contiguous copy, through cuBLASLt and not a fallback; columns at an offset cuBLASLt's algorithms do not
    assume aligned are declined (None), and fp8_gemm_accumulate still adds them, through a copy."""
    from infir.fp8.kernels.lt_wgrad import lt_wgrad

    qa, qb = _operands(1024, 640, 1024)
    sa, sb = outer_dim_major(qa.scale), outer_dim_major(qb.scale)
    half_b, half_sb = qb.data[:, 512:].contiguous(), outer_dim_major(sb[:, 4:])
    cols, cols_scale = qa.data[:, 512:], sa[:, 4:]
    assert not cols.is_contiguous() and cols_scale.stride() == (1, cols.shape[0])
    want = lt_wgrad(cols.contiguous(), cols_scale, half_b, half_sb, torch.float32)
    c0 = torch.randn(want.shape, device="cuda")
    acc = c0.clone()
    assert lt_wgrad(cols, cols_scale, half_b, half_sb, accumulate=acc) is acc
    assert torch.equal(acc, c0 + want)
    off, off_scale = qa.data[:, 128:256], sa[:, 1:2]
    assert lt_wgrad(off, off_scale, qb.data[:, :128].contiguous(), sb[:, :1], accumulate=c0.clone()) is None
    acc = c0.clone()
    fp8_gemm_accumulate(QTensor(off, off_scale, "token"), QTensor(qb.data[:, :128].contiguous(), sb[:, :1], "token"),
                        acc)
    ref = lt_wgrad(off.contiguous(), off_scale, qb.data[:, :128].contiguous(), outer_dim_major(sb[:, :1]))
    assert torch.equal(acc, c0 + ref)


def test_lt_wgrad_declines_what_it_does_not_take():
    """Not E4M3, K not a multiple of 128, an accumulator that is not FP32: None, for callers to fall back."""
    from infir.fp8.kernels.lt_wgrad import lt_wgrad

    qa, qb = _operands(*SHAPES[0])
    sa, sb = outer_dim_major(qa.scale), outer_dim_major(qb.scale)
    assert lt_wgrad(qa.data.view(torch.float8_e5m2), sa, qb.data.view(torch.float8_e5m2), sb) is None
    assert lt_wgrad(qa.data[:, :64].contiguous(), sa[:, :1], qb.data[:, :64].contiguous(), sb[:, :1]) is None
    acc = torch.zeros(qa.data.shape[0], qb.data.shape[0], device="cuda", dtype=torch.bfloat16)
    assert lt_wgrad(qa.data, sa, qb.data, sb, accumulate=acc) is None
