"""The high-precision linears' weight gradient added into megatron's FP32 main_grad by the wgrad GEMM
(infir.model.linears.linear, main_grad.add_product / mark_main_grad_adds) against F.linear's autograd."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from infir.model.linears import linear
from infir.model.main_grad import add_product, mark_main_grad_adds


def _weight(n: int, k: int, device: str = "cpu") -> torch.nn.Parameter:
    w = torch.nn.Parameter(torch.randn(n, k, device=device) / k**0.5)
    w.main_grad = torch.zeros(n, k, device=device)
    return w


def _reference(xs, w, b, autocast: bool):
    """F.linear's gradients, summed over the micro-batches in FP32 as megatron's hook adds them."""
    w0, b0 = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    dxs = []
    for x, dy in xs:
        x0 = x.detach().clone().requires_grad_()
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            y = F.linear(x0, w0, b0)
        y.backward(dy)
        dxs.append(x0.grad)
    return y, dxs, w0.grad, b0.grad


@pytest.mark.parametrize("autocast", [False, True])
def test_the_weight_gradient_lands_in_main_grad_summed_over_micro_batches(autocast):
    torch.manual_seed(0)
    w, b = _weight(48, 64), torch.nn.Parameter(torch.randn(48))
    xs = [(torch.randn(5, 3, 64), torch.randn(5, 3, 48)) for _ in range(2)]
    y_ref, dx_ref, dw_ref, db_ref = _reference(xs, w, b, autocast)
    for x, dy in xs:
        x = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = linear(x, w, b, into_main_grad=True)
        y.backward(dy)
        assert x.grad.shape == x.shape and w.grad.shape == w.shape  # a placeholder for DDP's hook to skip
        dx, w.grad = x.grad, None
    # BF16: the reference rounds each micro-batch's dW to BF16 before adding it, main_grad sums in FP32
    tol = 1e-2 if autocast else 1e-6

    def close(got, want):
        return got.dtype == want.dtype and (got.float() - want.float()).norm() <= tol * want.float().norm()

    assert close(y, y_ref) and close(dx, dx_ref[-1]) and close(w.main_grad, dw_ref)
    assert close(b.grad, db_ref)  # the bias goes back through autograd, to DDP's hook


def test_without_into_main_grad_it_is_f_linear():
    w, x = _weight(8, 16), torch.randn(4, 16)
    assert torch.equal(linear(x, w, None, into_main_grad=False), F.linear(x, w))
    linear(x, w, None, into_main_grad=False).sum().backward()
    assert w.main_grad.abs().sum() == 0 and w.grad is not None


def test_marks_only_weights_with_an_fp32_main_grad():
    fp32, bf16, none = _weight(4, 4), _weight(4, 4), torch.nn.Parameter(torch.randn(4, 4))
    bf16.main_grad = bf16.main_grad.bfloat16()  # optimizer.grad_reduce_dtype=bf16: each add would round
    linears = [SimpleNamespace(weight=w, to_main_grad=False) for w in (fp32, bf16, none)]
    mark_main_grad_adds(linears)
    assert [m.to_main_grad for m in linears] == [True, False, False]
    assert fp32.grad_added_to_main_grad and not hasattr(bf16, "grad_added_to_main_grad")


@pytest.mark.gpu
def test_gpu_bf16_products_add_into_fp32_in_the_gemm():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    a, b = torch.randn(384, 1000, device="cuda").bfloat16(), torch.randn(1000, 256, device="cuda").bfloat16()
    acc = torch.randn(384, 256, device="cuda")
    want = acc + a.float() @ b.float()
    ptr = acc.data_ptr()
    add_product(acc, a.t().contiguous().t(), b)  # a column-major view, as dY^T is
    assert acc.data_ptr() == ptr and acc.dtype == torch.float32
    assert torch.allclose(acc, want, rtol=1e-4, atol=1e-3)
