"""bench/side_stream.py: refused in one line without a GPU; on one, every form's replay runs the side stream's
copy (the script checks the copied bytes) and each GEMM of a layer gets a row per stand-in exchange."""
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
def test_without_a_gpu_it_says_so():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "side_stream.py")], capture_output=True, text=True,
                          env=ENV, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == "side_stream.py: needs a GPU"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_every_gemm_has_a_row_per_stand_in_and_form(tmp_path):
    out = tmp_path / "side_stream.md"
    subprocess.run([sys.executable, str(REPO / "bench" / "side_stream.py"), "--model", "qwen2.5-0.5b",
                    "--tokens", "1024", "--out", str(out)], check=True, env=ENV, timeout=600)
    rows = json.loads(out.with_suffix(".json").read_text())["tables"][0]["rows"]
    assert [(r["GEMM"], r["stand-in exchange"]) for r in rows] == [
        (g, s) for g in ("QKV", "FC1", "proj", "FC2") for s in ("16-block copy", "memcpy")]
    forms = ("eager", "graphed", "graphed, GEMM first", "graphed, carveout")
    assert all(r[f"{f} ms"] > 0 and r["alone ms"] > 0 and r["gemm ms"] > 0 for r in rows for f in forms), rows
