"""bench/generate.py: its kernel profile of a decode step (GPU time per step against the timed wall time per
step, the kernels that take most), and on a GPU the whole bench with --profile."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
sys.path.insert(0, str(REPO / "bench"))

import generate  # noqa: E402

from infir.eval.benchmarks import Sampling  # noqa: E402


class _Backend:
    """What kernel_profile reads of an HFBackend: its tokenizer, batch size and generate calls."""

    batch_size = 2

    def __init__(self):
        self.calls = []

    def tokenizer(self, texts, add_special_tokens=False):
        return {"input_ids": [t.split() for t in texts]}

    def generate(self, prompts, sampling, seed):
        self.calls.append((prompts, sampling.max_new_tokens))


def test_kernel_profile_reruns_the_warm_up_call_and_splits_a_step(monkeypatch):
    backend = _Backend()
    # two runs' kernels: 30 us of sort and 10 of gemm (3 and 1 launches) over 10 decode steps
    kernels = {"void cub::DeviceSegmentedRadixSortKernel": (30.0, 3), "sm90_gemm_bf16": (10.0, 1)}

    def fake_times(fn, reps):
        fn()
        return kernels

    monkeypatch.setattr(generate, "kernel_times_us", fake_times)
    texts = ["a b c", "a", "a b c d e", "a b"]
    row = generate.kernel_profile(backend, texts, Sampling(max_new_tokens=10), "static", ms_per_step=0.008)
    assert backend.calls == [(["a b c d e", "a b c"], 10)]  # the longest batch, at the timed length
    assert row["GPU ms/step"] == pytest.approx(0.004) and row["GPU busy %"] == pytest.approx(50)
    assert row["kernels a step"] == pytest.approx(0.4)
    assert row["top kernels (% of GPU time)"] == "void cub::DeviceSegmentedRadixSortKernel 75; sm90_gemm_bf16 25"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_profiled_bench_on_a_gpu(tmp_path):
    out = tmp_path / "gen.md"
    subprocess.run([sys.executable, str(REPO / "bench" / "generate.py"), "--device", "cuda", "--sizes", "tiny",
                    "--batch", "8", "--prompts", "16", "--new-tokens", "32", "--modes", "baseline", "static",
                    "--profile", "--out", str(out)], check=True, env=ENV, timeout=900)
    tables = json.loads(out.with_suffix(".json").read_text())["tables"]
    profiles = {r["mode"]: r for r in tables[1]["rows"]}
    assert set(profiles) == {"baseline", "static"}
    for row in profiles.values():
        assert row["GPU busy %"] > 0 and row["kernels a step"] > 1 and row["top kernels (% of GPU time)"]
