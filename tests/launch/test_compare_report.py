"""infir-compare on synthetic runs whose FP8-vs-BF16 differences are known (see conftest.py)."""
import json
import random
import re
import struct
import time

import numpy as np
import pytest
from synthetic_runs import FP8_LOSS_GAP, FP8_MEMORY, FP8_SPEEDUP, write_run

from infir.report.compare import build_report, main
from infir.report.pairing import pairs, relative_gap, run_stats, smooth
from infir.report.runs import discover, load_run_dir, score_leaves
from infir.report.wandb_offline import iter_records, read_offline_run


def test_pairs_recover_the_synthetic_fp8_differences(demo_runs):
    runs, evals = discover([demo_runs])
    assert sorted((r.precision, r.stage) for r in runs) == [
        ("bf16", "cpt"), ("bf16", "sft1"), ("fp8_blockwise_ue8m0", "cpt"), ("fp8_blockwise_ue8m0", "sft1")]
    found = pairs(runs)
    assert [(p.base.precision, p.other.precision, p.other.stage) for p in found] == [
        ("bf16", "fp8_blockwise_ue8m0", "cpt"), ("bf16", "fp8_blockwise_ue8m0", "sft1")]
    for p in found:
        s = p.summary()
        # 1 % multiplicative offset, +-1 % noise averaged over the last 5 % of steps
        assert s["final loss gap %"] == pytest.approx(100 * FP8_LOSS_GAP, abs=0.8)
        assert s["final val loss gap %"] == pytest.approx(100 * FP8_LOSS_GAP, abs=1e-9)
        assert s["tokens/s ratio"] == pytest.approx(FP8_SPEEDUP)  # warm-up steps excluded from the median
        assert s["peak memory ratio"] == pytest.approx(FP8_MEMORY)
    assert {e.variant: e.scores for e in evals} == {  # counts (problems, tokens) are not scores
        f"tiny-{p}": {"demo_arith avg@4": avg, "demo_arith pass@1": avg, "demo_arith pass@4": 0.75, "overall avg": avg}
        for p, avg in [("bf16", 0.50), ("fp8_blockwise_ue8m0", 0.48)]}


def test_score_leaves_of_a_summary_in_another_shape():
    assert score_leaves({"gsm8k": {"accuracy": 0.7, "n": 50, "sub": {"exact_match": 0.6}}, "seed": 3}) == {
        "gsm8k accuracy": 0.7, "gsm8k sub exact_match": 0.6}


def test_smooth_matches_a_plain_loop():
    rng = np.random.default_rng(random.randrange(2**32))
    values = rng.normal(size=200)
    values[rng.choice(200, 20, replace=False)] = np.nan
    for window in (1, 3, 17):
        expected = [np.mean(w[~np.isnan(w)]) if np.any(~np.isnan(w)) else np.nan
                    for w in (values[max(0, i - window):i + window + 1] for i in range(200))]
        # atol: a window's mean can land near 0 (values ~ N(0, 1)), where a different summation
        # order differs by ~1e-16 absolute and rtol alone flags it (seen in CI: 1.4e-16 at -4.9e-5).
        np.testing.assert_allclose(smooth(values, window), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(smooth(values[:29]), values[:29])  # too short to smooth


def test_relative_gap_matches_the_formula_on_a_finer_grid():
    rng = np.random.default_rng(random.randrange(2**32))
    base_x = np.sort(rng.choice(np.arange(10, 1000), 40, replace=False)).astype(float)
    other_x = np.union1d(base_x, rng.uniform(0, 1100, 100))  # holds every base point, plus others
    f = lambda x: 3 + np.sin(x / 50)  # noqa: E731
    g = lambda x: 3.2 + np.cos(x / 70)  # noqa: E731
    x, gap = relative_gap(base_x, f(base_x), other_x, g(other_x))
    np.testing.assert_allclose(x, base_x)
    np.testing.assert_allclose(gap, (g(base_x) - f(base_x)) / f(base_x), rtol=1e-12)
    # base points outside the other curve's token range are not extrapolated
    x, _ = relative_gap(base_x, f(base_x), base_x[5:20], g(base_x[5:20]))
    np.testing.assert_allclose(x, base_x[5:20])


def test_a_resumed_run_keeps_the_rows_it_logged_last(tmp_path):
    run = tmp_path / "tiny-bf16-cpt"
    run.mkdir()
    first = [{"step": s, "consumed_tokens": 10 * s, "loss": 10.0 - s} for s in range(1, 11)]
    again = [{"step": s, "consumed_tokens": 10 * s, "loss": 100.0 + s} for s in range(6, 13)]  # resumed at 5
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first + again) + '{"step": 13, "lo')
    with pytest.warns(UserWarning, match="torn last line"):
        loaded = load_run_dir(run)
    assert (loaded.model, loaded.precision, loaded.stage) == ("tiny", "bf16", "cpt")  # from the dir name
    assert [r["step"] for r in loaded.train] == list(range(1, 13))
    assert [r["loss"] for r in loaded.train] == [10.0 - s for s in range(1, 6)] + [100.0 + s for s in range(6, 13)]

    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1}\n{"step": 2, "lo\n{"step": 3, "loss": 1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line"):
        load_run_dir(run)


def test_runs_table_counts_steps_not_logged_rows(tmp_path):
    from infir.report.html import runs_table

    run = tmp_path / "tiny-bf16-cpt"
    run.mkdir()
    rows = [{"step": s, "consumed_tokens": 10 * s, "loss": 1.0} for s in range(10, 201, 10)]  # log_interval=10
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_run_dir(run).steps == 200
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", runs_table([load_run_dir(run)]))
    assert cells[5] == "200"  # run, model, precision, stage, status, steps


def test_report_page_and_plots_are_written(demo_runs, tmp_path):
    out = tmp_path / "report"
    assert main([str(demo_runs), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert pngs == sorted(f"{s}.png" for s in ["loss", "val_loss", "loss_gap", "tokens_per_s", "mfu", "peak_mem", "eval"])
    for name in pngs:
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'src="plots/{name}"' in page
    assert "tiny cpt: fp8_blockwise_ue8m0 vs bf16" in page and "demo_arith avg@4" in page
    assert f"{FP8_SPEEDUP:.4g}" in page


def test_cpu_runs_without_mfu_or_memory_get_no_empty_plots(tmp_path):
    for precision in ("bf16", "fp8_tensorwise"):
        d = write_run(tmp_path / precision, "tiny", precision, "cpt", steps=30)
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        cpu_rows = [{k: v for k, v in r.items() if k not in ("mfu", "peak_mem_gib")} for r in rows]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cpu_rows))
    _runs, _pairs, evals, written = build_report([tmp_path], tmp_path / "report")
    assert [slug for slug, _c, _p in written] == ["loss", "val_loss", "loss_gap", "tokens_per_s"]
    assert evals == []


def test_cli_names_a_missing_run_dir(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "nope: no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "r")]) == 2
    assert "no runs under" in capsys.readouterr().err


def _offline_run(tmp_path, name, config, rows, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="infir-test", name=name, dir=str(tmp_path), config=config)
    for row in rows:
        run.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
    run.finish()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    return wait_until_written(run_dir)


def wait_until_written(run_dir):
    """wandb-core may still be flushing the .wandb file when finish() returns: wait for its exit record."""
    deadline = time.time() + 30
    while not read_offline_run(run_dir).finished:
        assert time.time() < deadline, f"{run_dir}: no exit record 30 s after finish()"
        time.sleep(0.2)
    return run_dir


def test_wandb_offline_dirs_are_read_across_blocks_and_paired_with_metrics_dirs(tmp_path, monkeypatch):
    steps = 400  # ~100 KiB of history: records cross several 32 KiB blocks
    rows = [{"step": s, "train/loss": 5.0 / s, "consumed_tokens": 512 * s, "tokens_per_s": 900.0 + s}
            for s in range(1, steps + 1)]
    big = "x" * 70_000  # one record longer than two blocks: FIRST, MIDDLE, LAST chunks
    run_dir = _offline_run(tmp_path / "wb", "tiny-fp8_blockwise_ue8m0-cpt",
                           {"model": {"name": "tiny"}, "precision": "fp8_blockwise_ue8m0", "stage": "cpt", "note": big},
                           rows, monkeypatch)
    wandb_file = next(run_dir.glob("run-*.wandb"))
    assert wandb_file.stat().st_size > 3 * 32 * 1024
    off = read_offline_run(run_dir)
    assert off.finished and off.name == "tiny-fp8_blockwise_ue8m0-cpt" and off.config["note"] == big
    history = [r for r in off.history if "train/loss" in r]
    assert [(r["_step"], r["train/loss"], r["consumed_tokens"]) for r in history] == [
        (s, 5.0 / s, 512 * s) for s in range(1, steps + 1)]

    write_run(tmp_path / "ours" / "cpt", "tiny", "bf16", "cpt", steps=50, tokens_per_step=4096)
    runs, _ = discover([tmp_path / "ours", run_dir])
    (pair,) = pairs(runs)
    assert (pair.other.source, pair.other.stage, pair.other.status) == (run_dir, "cpt", "finished")
    assert run_stats(pair.other).final_loss == pytest.approx(np.mean([5.0 / s for s in range(381, 401)]))


def test_a_torn_wandb_file_yields_its_complete_records(tmp_path):
    chunk = struct.Struct("<IHB")
    good = [b"alpha", b"beta" * 10]
    body = b"".join(chunk.pack(0, len(p), 1) + p for p in good)
    (tmp_path / "run-x.wandb").write_bytes(b":W&B" + struct.pack("<HB", 0xBEE1, 0) + body + chunk.pack(0, 50, 1) + b"cut")
    assert list(iter_records(tmp_path / "run-x.wandb")) == good
    # a chunk header not yet written (zeros) ends what can be trusted, even if bytes follow it
    later = chunk.pack(0, 5, 1) + b"later"
    (tmp_path / "run-x.wandb").write_bytes(b":W&B" + struct.pack("<HB", 0xBEE1, 0) + body + bytes(7 + 5) + later)
    assert list(iter_records(tmp_path / "run-x.wandb")) == good
    (tmp_path / "run-x.wandb").write_bytes(b"PK\x03\x04 not wandb")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        list(iter_records(tmp_path / "run-x.wandb"))


def test_push_logs_the_same_plots_to_wandb(demo_runs, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "report"
    assert main([str(demo_runs), "--out", str(out), "--wandb-project", "infir-test", "--wandb-mode", "offline"]) == 0
    (pushed,) = (out / "wandb").glob("offline-run-*")
    wait_until_written(pushed)
    logged = {k: v for row in read_offline_run(pushed).history for k, v in row.items()}  # media are flattened dicts
    for png in (out / "plots").glob("*.png"):
        assert logged[f"plots/{png.stem}/_type"] == "image-file"
    for table, rows in [("runs", 4), ("comparisons", 2), ("eval", 2)]:
        assert (logged[f"{table}/_type"], logged[f"{table}/nrows"]) == ("table-file", rows)
    # a later compare over a folder that holds this report must not mistake the push for a training run
    runs, _ = discover([tmp_path])
    assert len(runs) == 4 and all(r.source.is_relative_to(demo_runs) for r in runs)
