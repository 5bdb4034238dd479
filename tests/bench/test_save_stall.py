"""bench/save_stall.py: refused in one line without a GPU; on one GPU a small model's asynchronous save
stalls the step less than the synchronous one, and both write the same checkpoint."""
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for hosts without a GPU")
def test_without_a_gpu_it_says_so_in_one_line():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "save_stall.py")], capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == \
        "save_stall.py: needs a GPU (run it under torchrun with one process per GPU)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_async_save_stalls_less_than_the_sync_one(tmp_path):
    out = tmp_path / "save_stall.md"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                    str(REPO / "bench" / "save_stall.py"), "--model", "qwen2.5-0.5b", "--parallel", "single",
                    "--seq", "1024", "--accum", "1", "--steps", "3", "--modes", "async", "sync",
                    "--dir", str(tmp_path / "ckpt"), "--out", str(out)], check=True, env=ENV, timeout=900)
    rows = {r["mode"]: r for r in json.loads(out.with_suffix(".json").read_text())["tables"][0]["rows"]}
    assert rows["async"]["written GB"] == rows["sync"]["written GB"] > 1
    assert rows["async"]["stall s"] < rows["sync"]["stall s"], rows
