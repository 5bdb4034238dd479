"""Fault tolerance with the real infir-train: two data-parallel ranks on CPU (gloo) through launch/torchrun.sh;
rank 1 is SIGKILLed once a checkpoint exists and a later step was logged. The job must stop naming rank 1,
and the same command must resume from the checkpoint and finish with every step logged. Slow (~3 min on
2 cores: two launches of two megatron processes), hence `slow`."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ITERS, SAVE_EVERY = 12, 4


def children(pid: int) -> list[int]:
    """All descendants of pid, from /proc (no psutil needed)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def local_rank_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"LOCAL_RANK=")]
    return ranks[0] if ranks and any(e.startswith(b"TORCHELASTIC_RUN_ID=") for e in env) else None


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r.get("loss") is not None]


@pytest.mark.slow
def test_killing_a_trainer_rank_stops_the_job_and_the_rerun_resumes_from_the_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    cmd = ["bash", str(REPO / "launch" / "torchrun.sh"), "model=tiny", f"run_dir={run_dir}", f"stage.iters={ITERS}",
           "train.log_interval=1", f"train.save_interval={SAVE_EVERY}", "train.eval_interval=0", "logger=none"]
    env = {**os.environ, "NPROC_PER_NODE": "2", "INFIR_LOG_DIR": str(tmp_path / "logs"), "PYTHON": sys.executable,
           "WANDB_MODE": "disabled"}
    job = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 400
    latest = run_dir / "checkpoints" / "latest"
    while not (latest.is_file() and max(logged_steps(run_dir), default=0) > SAVE_EVERY):
        assert job.poll() is None, f"the run ended before it could be killed:\n{job.communicate()[1][-3000:]}"
        assert time.time() < deadline, "no checkpoint and later step within 400 s"
        time.sleep(0.5)
    (victim,) = [p for p in children(job.pid) if local_rank_of(p) == "1"]
    os.kill(victim, signal.SIGKILL)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGKILL, stderr[-3000:]
    assert "infir-launch: rank 1 (local rank 1 on" in stderr and "killed by signal 9 (SIGKILL)" in stderr
    checkpoint = latest.read_text().strip()
    resumed_at = int(checkpoint.split("_")[1])
    assert json.loads((run_dir / "summary.json").read_text())["status"] != "finished"

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["step"], summary["dp"]) == ("finished", ITERS, 2)
    assert sorted(set(logged_steps(run_dir))) == list(range(1, ITERS + 1))  # nothing lost
    first = re.search(rf"step (\d+)/{ITERS} \| loss", done.stdout + done.stderr)
    assert first and int(first.group(1)) == resumed_at + 1, f"the rerun should continue after {checkpoint}"
