"""kernels/cuda_build.py: nvcc builds a .cu once per cache key, and every way of not having the CUDA
kernels (switched off, no nvcc, a failed build) leaves the Triton kernels in charge."""
import ctypes
import logging

import pytest
import torch

from infir.fp8.kernels import cuda_build
from infir.fp8.policy import policy_override


@pytest.mark.slow
def test_build_is_cached_and_the_entry_point_refuses_bad_shapes(tmp_path, monkeypatch):
    nvcc = cuda_build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed here (the GPU tests build the kernels where it is)")
    monkeypatch.setenv("INFIR_KERNEL_CACHE", str(tmp_path))
    src = cuda_build.SOURCE_DIR / "quant_two_level.cu"
    so = cuda_build.build(src, "sm_90a", nvcc)
    assert so.parent == tmp_path and so.exists() and not list(tmp_path.glob("*.tmp"))
    stamp = so.stat().st_mtime_ns
    assert cuda_build.build(src, "sm_90a", nvcc) == so and so.stat().st_mtime_ns == stamp  # not rebuilt
    lib = ctypes.CDLL(str(so))
    # K not a multiple of 32: cudaErrorInvalidValue (1), returned before any CUDA call (no GPU needed)
    p = ctypes.c_void_p(0)
    assert lib.infir_quant_two_level(p, ctypes.c_longlong(64), p, p, p, p, 4, 33, 1, 0, 0, p) == 1
    both = ctypes.CDLL(str(cuda_build.build(cuda_build.SOURCE_DIR / "quant_both.cu", "sm_90a", nvcc)))
    assert both.infir_quant_token_both(p, ctypes.c_longlong(64), p, p, p, p, 100, 128, 1, 0, 4, p) == 1  # M % 128
    # the fused SwiGLU backward's entry point, F not a multiple of 128
    assert both.infir_swiglu_bwd_quant_both(p, p, 0, p, ctypes.c_longlong(64), p, p, p, p, 128, 100, 1, 0, 4, p) == 1


def test_no_cuda_kernels_means_none(monkeypatch, caplog):
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(cuda_build, "_LOADED", {})
    with policy_override(cuda_kernels=False):
        assert cuda_build.load("quant_both", dev) is None
    monkeypatch.setattr(cuda_build, "find_nvcc", lambda: None)
    assert cuda_build.load("quant_both", dev) is None
    monkeypatch.setattr(cuda_build, "_LOADED", {})
    monkeypatch.setattr(cuda_build, "find_nvcc", lambda: "/nonexistent/nvcc")

    def broken(*a):
        raise RuntimeError("nvcc failed on quant_both.cu: syntax error")
    monkeypatch.setattr(cuda_build, "build", broken)
    with caplog.at_level(logging.WARNING, logger=cuda_build.__name__):
        assert cuda_build.load("quant_both", dev) is None
    assert "using the Triton kernels instead" in caplog.text and "syntax error" in caplog.text
    monkeypatch.setattr(cuda_build, "_LOADED", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # A100: no FP8 casts
    assert cuda_build.load("quant_both", dev) is None


def test_a_failing_autotune_candidate_is_skipped_with_a_warning(caplog):
    from infir.fp8.kernels.autotune import warmed

    x = torch.ones(4)

    def build(cfg):
        if cfg.get("CUDA"):
            def run(t):
                raise RuntimeError("quant_both.cu launch failed with cudaError 209")
            return run
        return lambda t: t * 2

    with caplog.at_level(logging.WARNING):
        assert warmed(build, {"CUDA": True}, x) is None
        assert torch.equal(warmed(build, {"num_warps": 4}, x)(x), x * 2)
    assert "skipped" in caplog.text and "cudaError 209" in caplog.text
