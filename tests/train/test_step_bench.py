"""bench/step.py's profile arithmetic on CPU: which kernels count as communication, and how much of
the collectives' time had no compute kernel beside it (a hand-made timeline)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import step  # noqa: E402

CUDA = torch.autograd.DeviceType.CUDA


def _kernel(name, start, end, device=CUDA, annotation=False):
    return SimpleNamespace(name=name, key=name, device_type=device, is_user_annotation=annotation,
                           time_range=SimpleNamespace(start=start, end=end))


def test_kernel_classes_of_the_profile():
    assert step.classify("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "communication"
    assert step.classify("nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_Ablk128_Bvec128_TNN") == "gemm"
    both = "void (anonymous namespace)::quant_token_both<(anonymous namespace)::{}, true, false, 4>(...)"
    assert step.classify(both.format("Bf16Rows")) == "quantize"
    assert step.classify(both.format("SwigluBwdRows")) == "swiglu+quantize (fused)"
    assert step.classify(both.format("SwigluFwdRows")) == "swiglu+quantize (fused)"
    assert step.classify("_swiglu_fp8_bwd_kernel") == "elementwise/other"
    assert step.classify("_quant_rows_kernel") == "quantize"
    assert step.classify("triton_red_fused__to_copy_add_fp8_quantize_pair_mean_mul_pow_rsqrt_view_0") != "quantize"


def test_exposed_communication_counts_only_time_without_compute(capsys):
    prof = SimpleNamespace(events=lambda: [
        _kernel("ncclDevKernel_AllGather", 0, 1000),        # 300 of it beside gemm_a, 100 beside gemm_b
        _kernel("nccl:all_gather_into_tensor", 0, 1000),    # the profiler's annotation of the same span: ignored
        _kernel("gemm_a", 200, 500),
        _kernel("gemm_b", 900, 2000),
        _kernel("ncclDevKernel_ReduceScatter", 1500, 1700),  # wholly beside gemm_b
        _kernel("ncclDevKernel_AllGather", 3000, 3400),      # alone
        _kernel("Optimizer.step#AdamW.step", 2900, 3500, annotation=True),  # a record_function span: not a kernel
        _kernel("cpu_op", 0, 5000, device=torch.autograd.DeviceType.CPU),
    ])
    step.exposed_communication(prof)
    out = capsys.readouterr().out
    # comm 1000 + 200 + 400 = 1600 us; exposed 600 + 0 + 400 = 1000 us
    assert "communication kernels: 1.6 ms in the profiled step, 1.0 ms of it" in out, out


def test_gap_histogram_bins_every_gap_once():
    rows = step.gap_histogram([3.0, 9.9, 10.0, 250.0, 499.0, 500.0, 2000.0])
    assert rows == [("<10 us", 2, 12.9), ("10-100 us", 1, 10.0), ("100-500 us", 2, 749.0),
                    (">=500 us", 2, 2500.0), ("all", 7, 3271.9)], rows
