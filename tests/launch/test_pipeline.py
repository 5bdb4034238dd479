"""launch/pipeline.sh: stage order, checkpoint hand-over between stages, skip-if-finished, resume-if-not.

The stages are tests/launch/fake_infir.py (infir-train / infir-eval's on-disk contracts); the report at
the end is the real infir-compare.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE = f"{sys.executable} {Path(__file__).with_name('fake_infir.py')}"


def pipeline(tmp_path: Path, *args: str, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "INFIR_TRAIN": f"{FAKE} train", "INFIR_EVAL": FAKE, "PYTHON": sys.executable,
           "INFIR_COMPARE": f"{sys.executable} -m infir.report.compare", "FAKE_LOG": str(tmp_path / "calls.jsonl"),
           **env}
    return subprocess.run(["bash", str(REPO / "launch" / "pipeline.sh"), "--out", str(tmp_path / "out"), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def calls(tmp_path: Path) -> list[dict]:
    path = tmp_path / "calls.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    return entries


def test_pipeline_stops_at_an_interrupted_stage_resumes_it_and_skips_what_finished(tmp_path):
    out = tmp_path / "out"
    both = ["--precision", "bf16,fp8_blockwise_ue8m0"]
    first = pipeline(tmp_path, *both, FAKE_INTERRUPT="sft1")
    assert first.returncode == 3, first.stderr
    assert "sft1 stopped with status 'interrupted'" in first.stderr
    assert [(c["stage"], c["resumed_from"]) for c in calls(tmp_path)] == [("cpt", None), ("sft1", None)]

    second = pipeline(tmp_path, *both)
    assert second.returncode == 0, second.stderr
    bf16, fp8 = out / "tiny-bf16", out / "tiny-fp8_blockwise_ue8m0"
    assert calls(tmp_path) == [
        # cpt is not run again; sft1 resumes from the checkpoint it wrote before stopping
        {"cmd": "train", "stage": "sft1", "precision": "bf16", "init_from": f"{bf16}/cpt/checkpoints",
         "resumed_from": "iter_0000005"},
        {"cmd": "train", "stage": "sft2", "precision": "bf16", "init_from": f"{bf16}/sft1/checkpoints", "resumed_from": None},
        {"cmd": "eval", "model": f"{bf16}/sft2/checkpoints", "label": "tiny-bf16"},
        {"cmd": "train", "stage": "cpt", "precision": "fp8_blockwise_ue8m0", "init_from": None, "resumed_from": None},
        {"cmd": "train", "stage": "sft1", "precision": "fp8_blockwise_ue8m0", "init_from": f"{fp8}/cpt/checkpoints",
         "resumed_from": None},
        {"cmd": "train", "stage": "sft2", "precision": "fp8_blockwise_ue8m0", "init_from": f"{fp8}/sft1/checkpoints",
         "resumed_from": None},
        {"cmd": "eval", "model": f"{fp8}/sft2/checkpoints", "label": "tiny-fp8_blockwise_ue8m0"},
    ]
    assert "cpt: finished earlier" in second.stderr and "sft1: was 'interrupted', resuming" in second.stderr
    page = (out / "report" / "index.html").read_text()
    for stage in ("cpt", "sft1", "sft2"):
        assert f"tiny {stage}: fp8_blockwise_ue8m0 vs bf16" in page
    assert "demo_arith avg@4" in page

    third = pipeline(tmp_path, *both)
    assert third.returncode == 0, third.stderr
    assert calls(tmp_path) == []  # everything finished: nothing runs again
    assert third.stderr.count("finished earlier") == 6 and third.stderr.count("eval: done earlier") == 2


def test_pipeline_rejects_an_unknown_option(tmp_path):
    done = pipeline(tmp_path, "--precison", "bf16")
    assert done.returncode == 2 and "unknown option '--precison'" in done.stderr


def test_the_demo_trains_bf16_and_fp8_side_by_side_and_the_report_compares_them(tmp_path):
    """`bash launch/pipeline.sh`, the README's first command: the project's point, FP8 against BF16, in its report."""
    done = pipeline(tmp_path)
    assert done.returncode == 0, done.stderr
    trained = [(c["precision"], c["stage"]) for c in calls(tmp_path) if c["cmd"] == "train"]
    assert trained == [(p, s) for p in ("bf16", "fp8_blockwise_ue8m0") for s in ("cpt", "sft1", "sft2")]
    page = (tmp_path / "out" / "report" / "index.html").read_text()
    assert "No pair to compare" not in page
    for stage in ("cpt", "sft1", "sft2"):
        assert f"tiny {stage}: fp8_blockwise_ue8m0 vs bf16" in page


def test_the_demo_scale_sets_the_train_intervals_as_well_as_the_stage_sizes():
    """conf/scale/demo.yaml's train values win over conf/config.yaml's (validation every 20 steps, not 500)."""
    from infir.train.cli import compose

    demo = compose([])
    assert (demo.stage.iters, demo.train.eval_interval, demo.train.eval_iters, demo.train.save_interval) == (40, 20, 4, 20)
    assert compose(["train.eval_interval=7"]).train.eval_interval == 7, "the command line still wins"
    assert compose(["scale=full"]).train.eval_interval == 500
