"""bench/parity.py end to end on CPU: concurrent runs (--jobs) give the same curves as one at a time."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "parity.py"


def _parity(tmp: Path, demo_root: Path, jobs: int) -> list[dict]:
    root = tmp / f"jobs{jobs}"
    cmd = [sys.executable, str(BENCH), "--model", "tiny", "--steps", "4", "--seq", "64", "--global-batch", "4",
           "--micro-batch", "4", "--root", str(root), "--data-root", str(demo_root),
           "--recipes", "bf16", "fp8_blockwise_ue8m0", "--jobs", str(jobs), "--out", str(root / "report.md")]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    assert (root / "report.png").stat().st_size > 0  # the curves, beside the report
    assert json.loads((root / "report.json").read_text())["tables"][0]["rows"][1]["recipe"] == "fp8_blockwise_ue8m0"
    report = (root / "report.md").read_text()
    assert "| fp8_blockwise_ue8m0 | 1 | 4 |" in report, report  # one seed, 4 steps
    curves = []
    for recipe in ("bf16", "fp8_blockwise_ue8m0"):
        lines = (root / f"tiny-{recipe}" / "metrics.jsonl").read_text().splitlines()
        curves.append([json.loads(line)["loss"] for line in lines if '"loss"' in line])
    return curves


@pytest.mark.slow
def test_concurrent_parity_runs_match_sequential(tmp_path, demo_root):
    sequential = _parity(tmp_path, demo_root, jobs=1)
    concurrent = _parity(tmp_path, demo_root, jobs=2)
    assert all(len(c) == 4 for c in sequential)
    assert concurrent == sequential
    # The console logs alone (what a GPU host may send back) give the same curves, to print precision.
    sys.path.insert(0, str(BENCH.parent))
    from parity import curve_from_log

    for recipe, curve in zip(("bf16", "fp8_blockwise_ue8m0"), concurrent):
        losses, vals = curve_from_log(tmp_path / "jobs2" / f"tiny-{recipe}.log")
        assert len(losses) == 4 and len(vals) == 1
        assert all(abs(a - b) <= 5e-5 for a, b in zip(losses, curve)), (losses, curve)


def test_seeds_give_paired_gaps_with_their_spread(tmp_path, demo_root):
    """--seeds: one run per recipe and seed (the default seed keeps its old run name), gaps paired by
    seed and averaged, their spread and BF16's own seed-to-seed spread in the report."""
    root = tmp_path / "seeds"
    cmd = [sys.executable, str(BENCH), "--model", "tiny", "--steps", "3", "--seq", "64", "--global-batch", "4",
           "--micro-batch", "4", "--root", str(root), "--data-root", str(demo_root), "--recipes", "bf16",
           "fp8_blockwise_ue8m0", "--seeds", "1234", "7", "--jobs", "2", "--out", str(root / "report.md")]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    tails = {}
    for recipe in ("bf16", "fp8_blockwise_ue8m0"):
        for name in (f"tiny-{recipe}", f"tiny-{recipe}-s7"):
            lines = (root / name / "metrics.jsonl").read_text().splitlines()
            tails[name] = [json.loads(line)["loss"] for line in lines if '"loss"' in line][-1]
    assert tails["tiny-bf16"] != tails["tiny-bf16-s7"], "the seed must change the run"
    gaps = [100 * (tails[f"tiny-fp8_blockwise_ue8m0{s}"] - tails[f"tiny-bf16{s}"]) / tails[f"tiny-bf16{s}"]
            for s in ("", "-s7")]
    report = (root / "report.md").read_text()
    assert "BF16's own tail loss varies by" in report and "gap std over seeds (%)" in report, report
    row = next(line for line in report.splitlines() if line.startswith("| fp8_blockwise_ue8m0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2"  # seeds
    mean = sum(gaps) / 2
    assert abs(float(cells[-2]) - mean) <= 5e-3 * max(1.0, abs(mean)), (cells, gaps)  # printed to 3 digits
