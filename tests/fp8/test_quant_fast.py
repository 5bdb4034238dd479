"""The fast paths of the quantization kernels: quotient algorithms (kernels/triton_fp8.py) equal to
IEEE division bit for bit, tiny/huge scales that take the guarded fallback, and the cached direct
launches.

The quotient check runs in Triton's interpreter too, but only where its fma rounds once (older
interpreters multiply and add in two roundings, and the kernels then use div_rn instead).
"""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from infir.fp8 import kernels as kn
from infir.fp8.kernels.triton_fp8 import quot, recip
from infir.fp8.quantize import quantize_reference
from qcheck import assert_same_q, rand


def quantize_two_level_folded_ref(x, sf):
    from infir.fp8.quantize import fold_two_level

    return fold_two_level(quantize_reference(x, "two_level", sf))


@triton.jit
def _quot_test_kernel(a_ptr, b_ptr, out_ptr, N, DIV: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    a = tl.load(a_ptr + offs, mask=m, other=1.0)
    b = tl.load(b_ptr + offs, mask=m, other=1.0)
    tl.store(out_ptr + offs, quot(a, b, recip(b), DIV), mask=m)


@triton.jit
def _fma_probe_kernel(out_ptr):
    a = tl.full([1], 1.000244140625, tl.float32)  # 1 + 2^-12
    tl.store(out_ptr + tl.arange(0, 1), tl.fma(a, a, tl.full([1], -1.00048828125, tl.float32)))


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _fma_is_fused() -> bool:
    out = torch.zeros(1, device=_device())
    _fma_probe_kernel[(1,)](out)
    return float(out[0]) == 2.0**-24  # (1 + 2^-12)^2 - (1 + 2^-11), one rounding


def quotient_cases(n, seed):
    """(a, b) float32 pairs with b in [2^-80, 2^80] and |a/b| in [2^-23, 2^9]: random quotients,
    quotients next to a float32 midpoint (the hard cases of correct rounding), exact ones, zeros."""
    g = np.random.default_rng(seed)
    b = (g.uniform(1, 2, n) * np.exp2(g.integers(-80, 81, n))).astype(np.float32)
    q = (g.uniform(1, 2, n) * np.exp2(g.integers(-23, 9, n)) * g.choice([-1, 1], n)).astype(np.float32)
    kind = g.integers(0, 4, n)
    q64 = q.astype(np.float64)
    ulp = np.spacing(np.abs(q)).astype(np.float64)
    target = np.where(kind == 1, q64 + np.sign(q64) * ulp / 2, q64)  # near a midpoint
    target = np.where(kind == 2, q64 + np.sign(q64) * ulp * g.uniform(-1, 1, n), target)
    a = (target * b.astype(np.float64)).astype(np.float32)
    a = np.where(kind == 3, q * b, a).astype(np.float32)  # often an exact quotient
    a[:4] = [0.0, -0.0, 0.0, -0.0]
    return torch.from_numpy(a), torch.from_numpy(b)


@pytest.mark.parametrize("div", [1, 2])
def test_fast_quotients_equal_ieee_division(div):
    if not _fma_is_fused():
        pytest.skip("this Triton interpreter rounds fma twice; the kernels use div_rn there")
    dev = _device()
    n = 1 << 22 if dev == "cuda" else 1 << 14
    a, b = quotient_cases(n, seed=int(torch.seed() % 2**31))
    if div == 1:  # power-of-two divisors
        b = torch.exp2(torch.round(torch.log2(b)))
    ref = (a / b).view(torch.int32)  # CPU float32 division: IEEE round to nearest
    out = torch.empty(n, device=dev)
    _quot_test_kernel[(triton.cdiv(n, 1024),)](a.to(dev), b.to(dev), out, n, DIV=div, BLOCK=1024)
    got = out.cpu().view(torch.int32)
    bad = (got != ref).nonzero().flatten()
    assert len(bad) == 0, f"{len(bad)} quotients differ, e.g. {a[bad[:3]].tolist()} / {b[bad[:3]].tolist()}"


def scaled_rows(shape, device):
    """Rows scaled by powers of two from 2^-120 to 2^100: scales inside and outside the range in
    which the fast quotients are used, so both paths of every kernel run."""
    x = rand(shape, device=device, dtype=torch.float32)
    exps = torch.tensor([-120, -100, -85, -70, -20, 0, 40, 75, 90, 100], dtype=torch.float32, device=device)
    return x * torch.exp2(exps[torch.arange(shape[0], device=device) % len(exps)])[:, None]


def check_scaled(x):
    xc = x.cpu()
    for sf in ("fp32", "ue8m0"):
        for gran in ("token", "block", "two_level", "tensor"):
            assert_same_q(kn.quantize_triton(x, gran, sf), quantize_reference(xc, gran, sf))
        _, qt = kn.quantize_token_triton(x, sf, rows=True, cols=True)
        assert_same_q(qt, quantize_reference(xc.t(), "token", sf))
        assert_same_q(kn.quantize_two_level_triton(x, sf, fold=True, block_m=2, block_k=64),
                      quantize_two_level_folded_ref(xc, sf))


@pytest.mark.slow
def test_tiny_and_huge_scales_match_reference():
    check_scaled(scaled_rows((300, 260), "cpu" if not torch.cuda.is_available() else "cuda"))


@pytest.mark.gpu
def test_gpu_tiny_and_huge_scales_match_reference():
    check_scaled(scaled_rows((3000, 2600), "cuda"))


def test_cached_launch_gives_fresh_outputs_and_same_bits():
    """A second call for the same shape goes through the cached launcher: new tensors, same bits."""
    x = rand((200, 300))
    a_q, a_t = kn.quantize_token_triton(x, rows=True, cols=True)
    b_q, b_t = kn.quantize_token_triton(x, rows=True, cols=True)
    assert a_q.data.data_ptr() != b_q.data.data_ptr()
    assert_same_q(a_q, b_q)
    assert_same_q(a_t, b_t)
    assert a_q.scale.shape == (200, 3) and a_q.scale.stride() == (1, 200)  # outer-dim-major
    assert a_t.scale.shape == (300, 2) and a_t.scale.stride() == (1, 300)
    y = rand((200, 300))  # same shape, new values: the cache holds no data
    assert_same_q(kn.quantize_token_triton(y)[0], quantize_reference(y, "token"))
    sl = rand((201, 300))[1:]  # a view whose pointer is not 16-byte aligned: its own entry
    assert_same_q(kn.quantize_token_triton(sl)[0], quantize_reference(sl, "token"))


def test_given_scale_path_keeps_ieee_division():
    x = rand((64, 96), dtype=torch.float32) * 1e30  # x / s overflows: saturates, no NaN
    q, _ = kn.quantize_tensor_triton(x, "fp32", scale=torch.tensor(1e-10))
    from infir.fp8.formats import E4M3
    from infir.fp8.quantize import quantize_tensor_ref

    assert_same_q(q, quantize_tensor_ref(x, E4M3, "fp32", scale=torch.tensor(1e-10)))
