"""Every fast kernel against its plain-PyTorch reference: one test per pair of infir/fp8/kernels/registry.py.

On CPU the Triton kernels run in Triton's interpreter (tests/fp8/conftest.py), with the software FP8
cast; on a GPU compiled, at larger shapes. The reference always runs on the CPU. Pairs that need the
CUDA C++ library or Hopper's cuBLASLt are marked `gpu`.
"""
import dataclasses

import pytest
import torch

from infir.fp8.kernels.registry import PAIRS, Close, Exact, KernelPair, NormClose
from infir.fp8.quantize import QTensor

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _param(pair: KernelPair):
    marks = [pytest.mark.gpu] if pair.needs != "triton" else []
    return pytest.param(pair, id=pair.name, marks=marks)


def to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, QTensor):
        return dataclasses.replace(obj, data=obj.data.cpu(), scale=obj.scale.cpu(),
                                   global_scale=None if obj.global_scale is None else obj.global_scale.cpu(),
                                   local_exp=None if obj.local_exp is None else obj.local_exp.cpu())
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_cpu(o) for o in obj)
    return obj


def tensors(out) -> list:
    """The tensors of one output, in order (a QTensor's data, scales, global scales, E8M0 codes)."""
    if out is None:
        return []
    if isinstance(out, QTensor):
        return [t for t in (out.data, out.scale, out.global_scale, out.local_exp) if t is not None]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in tensors(o)]
    return [out]


def check(got, want, match, where: str) -> None:
    if isinstance(got, QTensor) or isinstance(want, QTensor):
        assert (got.granularity, got.scale_format, got.fmt) == (want.granularity, want.scale_format, want.fmt), where
    gt, wt = tensors(got), tensors(want)
    assert len(gt) == len(wt), f"{where}: {len(gt)} tensors against {len(wt)}"
    for i, (g, w) in enumerate(zip(gt, wt)):
        at = f"{where}, tensor {i}"
        assert g.shape == w.shape and g.dtype == w.dtype, f"{at}: {g.shape} {g.dtype} vs {w.shape} {w.dtype}"
        if isinstance(match, Exact) and g.dtype in _FP8:
            bad = (g.view(torch.uint8) != w.view(torch.uint8)).nonzero()
            assert len(bad) == 0, f"{at}: {len(bad)} FP8 bytes differ, first at {bad[:3].tolist()}"
        elif isinstance(match, Exact):
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{at}: {m}")
        elif isinstance(match, Close):
            torch.testing.assert_close(g.float(), w.float(), rtol=match.rtol, atol=match.atol, equal_nan=True,
                                       msg=lambda m: f"{at} ({match.reason}): {m}")
        else:
            assert isinstance(match, NormClose), match
            err = float((g.double() - w.double()).norm() / w.double().norm())
            assert err < match.tol, f"{at}: relative error {err:.3g} >= {match.tol} ({match.reason})"


@pytest.mark.parametrize("pair", [_param(p) for p in PAIRS])
def test_kernel_matches_its_reference(pair: KernelPair):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if pair.needs == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuBLASLt's blockwise FP8 GEMM needs an sm90 GPU")
    inputs = pair.inputs(device)
    got = to_cpu(pair.kernel(*inputs))
    want = pair.reference(*to_cpu(inputs))
    if isinstance(pair.match, tuple):
        assert len(got) == len(want) == len(pair.match), pair.name
        for i, (g, w, m) in enumerate(zip(got, want, pair.match)):
            check(g, w, m, f"{pair.name}, output {i}")
    else:
        check(got, want, pair.match, pair.name)


def test_registry_names_are_unique_and_tolerances_say_why():
    assert len({p.name for p in PAIRS}) == len(PAIRS)
    for p in PAIRS:
        for m in p.match if isinstance(p.match, tuple) else (p.match,):
            assert isinstance(m, Exact) or m.reason, p.name
