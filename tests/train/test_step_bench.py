"""bench/step.py's profile arithmetic on CPU: which kernels count as communication, and how much of
the collectives' time had no compute kernel beside it (a hand-made timeline)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
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
    # the copy-engine transport's transfers and peer waits are communication; a local copy is not
    assert step.classify("Memcpy PtoP (Device -> Device)") == "communication"
    assert step.classify("c10d::symmetric_memory::barrier_kernel(unsigned int**, int, int, int, unsigned long)") \
        == "communication"
    assert step.classify("Memcpy DtoD (Device -> Device)") == "copies"
    both = "void (anonymous namespace)::quant_token_both<(anonymous namespace)::{}, true, false, 4>(...)"
    assert step.classify(both.format("Bf16Rows")) == "quantize"
    assert step.classify(both.format("SwigluBwdRows")) == "swiglu+quantize (fused)"
    assert step.classify(both.format("SwigluFwdRows")) == "swiglu+quantize (fused)"
    assert step.classify("_swiglu_fp8_bwd_kernel") == "elementwise/other"
    assert step.classify("_quant_rows_kernel") == "quantize"
    # the FP8 weights' block quantizers: per weight element, not per token
    assert step.classify("_quant_block_kernel") == "weight quantize"
    assert step.classify("_range_quant_kernel") == "weight quantize"
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
        # the copy-engine transport: a peer copy half beside gemm_b, a barrier wait alone
        _kernel("Memcpy PtoP (Device -> Device)", 1900, 2100),
        _kernel("c10d::symmetric_memory::barrier_kernel(unsigned int**, int, int, int, unsigned long)", 4000, 4300),
    ])
    step.exposed_communication(step.kernel_spans(prof), (0, 5000))
    out = capsys.readouterr().out
    # comm 1000 + 200 + 400 + 200 + 300 = 2100 us; exposed 600 + 0 + 400 + 100 + 300 = 1400 us
    assert "communication kernels: 2.1 ms in the measured step, 1.4 ms of it" in out, out
    assert ("AllGather 1.0 [0.6 0.0 0.0 0.0 0.0 0.0 0.4 0.0 0.0 0.0]; Memcpy PtoP 0.1 [0.0 0.0 0.0 0.1 0.0 0.0 0.0 0.0 "
            "0.0 0.0]; ReduceScatter 0.0 [0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0]; barrier 0.3 ") in out, out


def test_the_middle_of_three_profiled_steps_is_measured(capsys):
    """Step 0 starts with an AllReduce waiting on the other ranks, step 1's parameter gathers end beside step 2's
    forward: only step 1 counts, and its gathers are covered by the next step's compute."""
    marks = [_kernel(f"{step.STEP_MARK}{i}", 1000 * i, 1000 * i + 900, annotation=True) for i in range(3)]
    prof = SimpleNamespace(events=lambda: [
        *marks,
        _kernel("ncclDevKernel_AllReduce", 0, 300),          # step 0: alone (outside the measured step)
        _kernel("gemm", 300, 900), _kernel("gemm", 1000, 1700),
        _kernel("ncclDevKernel_ReduceScatter", 1700, 1800),  # step 1: the last bucket, alone
        _kernel("adam_kernel", 1800, 1900),
        _kernel("ncclDevKernel_AllGather", 1900, 2300),      # step 1's gathers: 100 alone, then beside step 2's gemm
        _kernel("gemm", 2000, 2900),
    ])
    kernels = step.kernel_spans(prof)
    assert step.middle_step(prof, kernels) == (1000, 2000)
    shares = step.step_profile(kernels, (1000, 2000))
    # kernel time of the step: gemm 700 + RS 100 + adam 100 + AG 400 (it starts in the step) = 1300
    assert abs(shares["exposed communication"] - 200 / 1300) < 1e-9, shares
    assert abs(shares["all-gather"] - 400 / 1300) < 1e-9, shares
    assert "communication kernels: 0.2 ms in the measured step, 0.2 ms of it" in capsys.readouterr().out


def test_gap_histogram_bins_every_gap_once():
    rows = step.gap_histogram([3.0, 9.9, 10.0, 250.0, 499.0, 500.0, 2000.0])
    assert rows == [("<10 us", 2, 12.9), ("10-100 us", 1, 10.0), ("100-500 us", 2, 749.0),
                    (">=500 us", 2, 2500.0), ("all", 7, 3271.9)], rows


def test_processes_timed_beside_each_other_meet_before_each_timed_run(tmp_path, monkeypatch):
    """--beside DIR:N: a process waits at each timed run until N have come (here the other one came first),
    and one left alone says how many came and what to do."""
    monkeypatch.setattr(step, "_meetings", 0)
    monkeypatch.setattr(step, "BESIDE", (tmp_path / "meet", 2))
    (tmp_path / "meet" / "0").mkdir(parents=True)
    (tmp_path / "meet" / "0" / "other").touch()
    step.meet_beside(timeout_s=5)
    assert sorted(p.name for p in (tmp_path / "meet" / "0").iterdir()) == sorted(["other", str(os.getpid())])
    with pytest.raises(SystemExit, match="1 of 2 processes came to timed run 1.*same --cases"):
        step.meet_beside(timeout_s=0.1)  # the second timed run: the other process never comes
    monkeypatch.setattr(step, "BESIDE", None)
    step.meet_beside(timeout_s=0)  # not beside others: nothing to wait for
