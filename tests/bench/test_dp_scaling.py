"""bench/dp_scaling.py on CPU: each DP case against its one-GPU twin, and against the one-GPU cases timed on
every GPU at once (--beside), from hand-made bench/step.py result files."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import dp_scaling  # noqa: E402

COLUMNS = ["model", "seq", "recompute", "accum", "precision", "step_ms", "tokens/s", "peak_mem_GiB"]


def _result(ranks: int, rows: list[tuple[str, float]]) -> dict:
    return {"env": {"device": "GPU", "command": "python bench/step.py"},
            "notes": [f"parallel: single, {ranks} rank(s); TFLOP/s and MFU per GPU"],
            "tables": [{"columns": COLUMNS, "rows": [dict(zip(COLUMNS, ["m", 4096, "none", 1, p, 100.0, t, 30.0]))
                                                     for p, t in rows]}]}


def test_each_dp_case_against_its_one_gpu_twin_and_the_twins_timed_at_once():
    one = _result(1, [("bf16", 1000.0), ("fp8", 1200.0)])
    many = _result(4, [("bf16", 3600.0), ("fp8+optimizer.fp8_param_gather=true", 4320.0)])
    beside = [_result(1, [("bf16", 960.0), ("fp8", 1180.0)]), _result(1, [("bf16", 940.0), ("fp8", 1220.0)])]
    rows = {r["case"]: r for r in dp_scaling.scaling_rows(one, [many], beside)}
    assert rows["bf16"]["% of DP=1"] == pytest.approx(90.0) and rows["bf16"]["% of DP=1 beside"] == pytest.approx(900 / 9.4)
    # an optimizer.* override compares with the case without it
    assert rows["fp8+optimizer.fp8_param_gather=true"]["% of DP=1 beside"] == pytest.approx(108000 / 1180)
    assert "% of DP=1 beside" not in dp_scaling.scaling_rows(one, [many])[0]


def test_a_case_missing_from_a_run_beside_the_others_is_named():
    one = _result(1, [("bf16", 1000.0)])
    with pytest.raises(SystemExit, match="not timed in every --beside result"):
        dp_scaling.scaling_rows(one, [_result(2, [("bf16", 1800.0)])], [_result(1, [("fp8", 1.0)])])


def test_peaks_are_those_the_gpu_held_and_unknown_where_graph_pools_went_unrecorded():
    """A DP row's peaks are the reserved ones bench/step.py records; a result that has only allocated peaks gives
    them for cases without CUDA graphs, and none for the graphed ones, whose pools those peaks miss."""
    old = _result(1, [("bf16", 1000.0), ("fp8_blockwise_ue8m0", 1200.0)])
    new = _result(2, [("bf16", 1900.0), ("fp8_blockwise_ue8m0", 2300.0)])
    for row in new["tables"][0]["rows"]:
        row["peak_reserved_GiB"] = 41.5
    rows = {r["case"]: r for r in dp_scaling.scaling_rows(old, [new])}
    assert rows["bf16"]["peak GiB held"] == rows["fp8_blockwise_ue8m0"]["peak GiB held"] == 41.5
    assert rows["bf16"]["DP=1 peak GiB held"] == 30.0 and rows["fp8_blockwise_ue8m0"]["DP=1 peak GiB held"] is None


def test_zero1_peak_predicted_from_the_one_gpu_states_and_replicated_ones_unchanged():
    """ZeRO-1 at DP=4 should shed 3/4 of the DP=1 case's optimizer states from its held peak; a replicated case
    none; results that recorded no states give no prediction."""
    one = _result(1, [("bf16", 1000.0)])
    # as a result file holds them: a flag as its report printed it
    one["tables"][0]["rows"][0].update(peak_reserved_GiB=40.0, optim_state_GiB=8.0, sharded_states="False")
    many = _result(4, [("bf16", 3600.0), ("bf16+optimizer.distributed=false", 3500.0)])
    zero1, replicated = many["tables"][0]["rows"]
    zero1.update(peak_reserved_GiB=35.0, optim_state_GiB=2.0, sharded_states="True")
    replicated.update(peak_reserved_GiB=40.4, optim_state_GiB=8.0, sharded_states="False")
    rows = {r["case"]: r for r in dp_scaling.scaling_rows(one, [many])}
    assert rows["bf16"]["predicted peak GiB held"] == pytest.approx(34.0)
    assert rows["bf16"]["peak vs predicted %"] == pytest.approx(100 / 34)
    assert rows["bf16+optimizer.distributed=false"]["predicted peak GiB held"] == pytest.approx(40.0)
    assert rows["bf16+optimizer.distributed=false"]["peak vs predicted %"] == pytest.approx(1.0)
    del one["tables"][0]["rows"][0]["optim_state_GiB"]
    assert "predicted peak GiB held" not in dp_scaling.scaling_rows(one, [many])[0]
