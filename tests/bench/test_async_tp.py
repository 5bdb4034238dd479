"""bench/async_tp.py: refused in one line without GPUs under torchrun; on two GPUs every fused (async TP) and
split (infir's tp_comm_overlap) form, eager and replayed from a CUDA graph, computes what the NCCL-then-GEMM form
does, for each GEMM of a layer, BF16 and FP8."""
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


def test_without_two_gpus_under_torchrun_it_says_how_to_run_it():
    env = {k: v for k, v in ENV.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "async_tp.py")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == ("async_tp.py: needs two or more GPUs under torchrun: "
                                                     "torchrun --nproc-per-node 2 bench/async_tp.py --out FILE.md")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_every_fused_form_computes_what_gather_then_gemm_does(tmp_path):
    out = tmp_path / "async_tp.md"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                    str(REPO / "bench" / "async_tp.py"), "--model", "qwen2.5-0.5b", "--tokens", "1024", "--iters", "3",
                    "--out", str(out)], check=True, env=ENV, timeout=600)
    rows = json.loads(out.with_suffix(".json").read_text())["tables"][0]["rows"]
    assert {(r["GEMM"], r["precision"]) for r in rows} == {(g, p) for g in ("QKV", "FC1", "proj", "FC2")
                                                          for p in ("bf16", "fp8")}
    # the same products summed in another order (the reduce-scatter's partials): BF16 rounding apart
    assert all(r["fused vs sequential (rel.)"] < 1e-2 and r["fused ms"] > 0 for r in rows), rows
    assert all(r["split vs sequential (rel.)"] < 1e-2 and r["split ms"] > 0 for r in rows), rows
    # replayed from CUDA graphs, with and without SMs carved out of the GEMMs: the same products
    assert all(r["graphed vs sequential (rel.)"] < 1e-2 and r["split graphed ms"] > 0
               and r["split graphed, carveout ms"] > 0 for r in rows), rows
    assert all(r["fused graphed vs sequential (rel.)"] < 1e-2 and r["fused graphed ms"] > 0 for r in rows), rows
    # the split schedules also over NCCL exchanges (the copy engines' baseline)
    assert all(r["exchanges vs sequential (rel.)"] < 1e-2 and r["split graphed, exchanges ms"] > 0 for r in rows), rows
