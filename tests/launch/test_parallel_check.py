"""launch/parallel_check.py's comparison of TP/DP layouts against one rank (runs pre-written, no launch)."""
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "launch"))
import parallel_check  # noqa: E402


def write_layout(root: Path, name: str, losses: list[float], tokens_per_s: float, mem: float | None,
                 grad_norm: float = 4.0) -> None:
    run = root / name
    run.mkdir(parents=True)
    rows = [{"step": i + 1, "consumed_tokens": 100 * (i + 1), "loss": loss, "tokens_per_s": tokens_per_s * (0.2 if i == 0 else 1),
             "peak_mem_gib": mem, "grad_norm": grad_norm / (i + 1)} for i, loss in enumerate(losses)]
    rows.insert(3, {"step": 3, "consumed_tokens": 300, "val_loss": 9.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"status": "finished"}))


def table_rows(md: Path) -> dict[str, list[str]]:
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in md.read_text().splitlines() if line.startswith("| ") and "layout" not in line}


def test_layouts_are_compared_with_the_single_rank_run(tmp_path, capsys):
    base = [10.0 / s for s in range(1, 21)]
    write_layout(tmp_path, "single", base, 1000.0, 20.0)
    write_layout(tmp_path, "tp2", [v * (1 + 1e-3 * (-1) ** i) for i, v in enumerate(base)], 1800.0, 11.0, 4.04)
    write_layout(tmp_path, "dp2", [v * 1.005 if i == 7 else v for i, v in enumerate(base)], 1900.0, None)
    md = tmp_path / "table.md"
    assert parallel_check.main(["--out", str(tmp_path), "--md", str(md), "--", "model=tiny"]) == 0
    rows = table_rows(md)
    assert rows["single"][:5] == ["1", "20", "0.00e+00", "0.00e+00", "yes"]
    assert rows["tp2"][2:5] == ["1.00e-03", "1.00e-02", "yes"] and rows["tp2"][7] == "1.80x" and rows["tp2"][8] == "11.00"
    assert rows["dp2"][2] == "5.00e-03" and rows["dp2"][7] == "1.90x" and rows["dp2"][8] == "nan"
    text = md.read_text()
    assert "command: `python launch/parallel_check.py --out" in text and text in capsys.readouterr().out + "\n"


def test_a_layout_with_wrong_gradients_fails_the_check(tmp_path, capsys):
    """What TP=2 looked like with broken gradients: the same first loss, a loss curve within 2% of one rank's
    over a short run, and a first-step gradient norm 17x smaller."""
    base = [9.18 - 0.003 * s for s in range(20)]
    write_layout(tmp_path, "single", base, 1000.0, 5.0, 3.99)
    write_layout(tmp_path, "tp2", [base[0]] * 20, 500.0, 2.0, 0.236)
    write_layout(tmp_path, "dp2", base, 1900.0, 4.0, 3.99)
    md = tmp_path / "table.md"
    assert parallel_check.main(["--out", str(tmp_path), "--md", str(md), "--loss-tol", "0.02", "--", "model=tiny"]) == 1
    rows = table_rows(md)
    assert rows["tp2"][4] == "**no**" and rows["dp2"][4] == "yes", rows
    assert "tp2 did not train as one rank" in capsys.readouterr().err


def test_runs_without_a_common_step_are_refused():
    with pytest.raises(ValueError, match="no common step"):
        parallel_check.compare({1: {"loss": 1.0}}, {2: {"loss": 1.0}})
    assert math.isnan(parallel_check.median_after_warmup([None, math.nan]))
    assert parallel_check.median_after_warmup([100.0] + [1.0, 3.0, 2.0] * 3) == 2.0


@pytest.mark.slow
def test_tp2_and_dp2_through_the_launcher_match_one_rank_on_cpu(tmp_path):
    """The real infir-train, three launches of launch/torchrun.sh (gloo): ~80 s on 2 cores."""
    md = tmp_path / "table.md"
    assert parallel_check.main(["--out", str(tmp_path), "--md", str(md), "--", "model=tiny", "stage.iters=4",
                                "train.log_interval=1", "train.eval_interval=0", "logger=none"]) == 0
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in md.read_text().splitlines() if line.startswith("| ") and "layout" not in line}
    assert set(rows) == {"single", "tp2", "dp2"}
    for layout in ("tp2", "dp2"):
        assert rows[layout][1] == "4" and float(rows[layout][2]) < 1e-4, f"{layout}: {rows[layout]}"
