"""infir.fp8.dispatch picks the reference or the kernels with the same results, under a kernel policy
read once from the environment; the reference layer it picks from imports no kernel."""
import ast
from pathlib import Path

import pytest
import torch

import infir.fp8
from infir.fp8.dispatch import (KernelPolicy, kernel_policy, policy_override, quantize, quantize_pair, transpose_q,
                                transposed)
from infir.fp8.quantize import fold_two_level, quantize_reference
from qcheck import assert_same_q, rand

REFERENCE_MODULES = ["formats", "quantize", "swiglu_reference", "gemm_reference", "lm_loss_reference", "policy"]


@pytest.mark.parametrize("name", REFERENCE_MODULES)
def test_reference_modules_import_no_kernel(name):
    """Not at the top, not inside functions: the reference layer stands without Triton or CUDA."""
    tree = ast.parse((Path(infir.fp8.__file__).parent / f"{name}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = "." * node.level + (node.module or "")
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            target, names = "", [a.name for a in node.names]
        else:
            continue
        assert "kernels" not in target and "dispatch" not in target and "kernels" not in names, (name, target)
        assert not any(n.startswith(("triton", "infir.fp8.kernels")) for n in [target.lstrip("."), *names]), name


def _expected(x, gran, sf, fmt):
    quant = (lambda t: fold_two_level(quantize_reference(t, gran, sf, fmt))) if gran == "two_level" else \
        (lambda t: quantize_reference(t, gran, sf, fmt))
    q = quant(x)
    return q, (q.t() if gran == "tensor" else quant(x.t()))


@pytest.mark.parametrize("gran", ["token", "tensor", "two_level"])
def test_quantize_pair_gives_each_layout_asked_for(gran):
    x = rand((130, 256), seed=1)
    want, want_t = _expected(x, gran, "ue8m0", "e4m3")
    q, qt = quantize_pair(x, gran, "ue8m0", "e4m3", rows=True, cols=True)
    assert_same_q(q, want)
    assert_same_q(qt, want_t)
    assert quantize_pair(x, gran, "ue8m0", "e4m3", rows=False, cols=True)[0] is None
    assert quantize_pair(x, gran, "ue8m0", "e4m3")[1] is None
    with pytest.raises(ValueError, match="quantize_pair takes"):
        quantize_pair(x, "block", "ue8m0", "e4m3")


@pytest.mark.gpu
@pytest.mark.parametrize("gran", ["token", "tensor", "two_level"])
@pytest.mark.parametrize("sf", ["ue8m0", "fp32"])
def test_gpu_quantize_pair_equals_the_cpu_reference(gran, sf):
    """The kernels quantize_pair picks on CUDA give the CPU reference's bytes, from a row-strided view too."""
    x = rand((1000, 1536 + 128), device="cuda", seed=2)[:, 128:]
    want, want_t = _expected(x.cpu(), gran, sf, "e4m3")
    q, qt = quantize_pair(x, gran, sf, "e4m3", rows=True, cols=True)
    assert_same_q(q, want)
    assert_same_q(qt, want_t)


def test_quantize_picks_by_impl_and_device():
    x = rand((37, 160), seed=3)
    for gran in ("tensor", "token", "block", "two_level"):
        assert_same_q(quantize(x, gran, impl="triton"), quantize_reference(x, gran))  # the interpreter on CPU
        assert_same_q(quantize(x, gran), quantize_reference(x, gran))
    assert infir.fp8.quantize is quantize
    with pytest.raises(ValueError, match="unknown impl"):
        quantize(x, "token", impl="cuda")


def test_transposes():
    x = rand((130, 257), seed=4).to(torch.float8_e4m3fn)
    assert torch.equal(transposed(x).view(torch.uint8), x.view(torch.uint8).t().contiguous())
    q = quantize_reference(rand((130, 257), seed=5), "block")
    assert_same_q(transpose_q(q), q.t())
    assert transpose_q(q).data.is_contiguous()


@pytest.mark.gpu
def test_gpu_transposes_equal_the_reference():
    x = rand((1536, 8960), device="cuda", seed=6)
    q = quantize(x, "block")
    assert_same_q(transpose_q(q), quantize_reference(x.cpu(), "block").t())
    assert torch.equal(transposed(x).cpu(), x.cpu().t().contiguous())


def test_the_policy_is_read_from_the_environment_once():
    env = {"INFIR_CUDA_KERNELS": "0", "INFIR_FP8_AUTOTUNE": "0", "TRITON_INTERPRET": "1"}
    assert KernelPolicy.from_env(env) == KernelPolicy(cuda_kernels=False, autotune=False, interpret=True)
    assert KernelPolicy.from_env({}) == KernelPolicy(cuda_kernels=True, autotune=True, interpret=False)
    assert kernel_policy() is kernel_policy()
    before = kernel_policy()
    with policy_override(autotune=False) as p:
        assert kernel_policy() is p and not p.autotune and p.interpret == before.interpret
    assert kernel_policy() is before
