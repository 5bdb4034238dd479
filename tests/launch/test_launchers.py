"""The torchrun launchers and the SLURM template, driven on CPU (gloo) with tests/launch/standin_train.py.

Fault tolerance: one rank is killed mid-run; the job must stop (not hang), name that rank, keep every
rank's log, and the same command must then resume from the last checkpoint with nothing lost.
"""
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from standin_train import expected_acc
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

REPO = Path(__file__).resolve().parents[2]
STANDIN = f"{sys.executable} {Path(__file__).with_name('standin_train.py')}"
sys.path.insert(0, str(REPO / "launch"))
import elastic  # noqa: E402  (launch/ is scripts, not a package)


def launch(script: str, args: list[str], tmp_path: Path, timeout: int = 120, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "INFIR_CMD": STANDIN, "PYTHON": sys.executable, "INFIR_LOG_DIR": str(tmp_path / "logs"),
           "NPROC_PER_NODE": "2", **env}
    return subprocess.run(["bash", str(REPO / "launch" / script), *args], cwd=REPO, env=env, timeout=timeout,
                          capture_output=True, text=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shell_scripts_parse():
    for script in ["lib.sh", "torchrun.sh", "torchrun_multinode.sh", "slurm.sbatch", "pipeline.sh"]:
        done = subprocess.run(["bash", "-n", str(REPO / "launch" / script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{script}: {done.stderr}"


def _failure(tmp_path: Path, rank: int, exitcode: int, error_at: float | None = None) -> ProcessFailure:
    error_file = tmp_path / f"error{rank}.json"
    if error_at is not None:
        error_file.write_text(json.dumps({"message": {"message": f"RuntimeError: rank {rank}",
                                                      "extraInfo": {"py_callstack": "tb", "timestamp": "0"}}}))
        os.utime(error_file, (error_at, error_at))
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file=str(error_file))


def test_root_cause_prefers_the_killed_rank_over_its_failing_peers(tmp_path):
    # rank 2 was SIGKILLed; rank 0 then raised in its all-reduce (its error recorded even earlier, as
    # can happen before the agent polls); rank 1 was stopped by the agent's SIGTERM.
    failures = {0: _failure(tmp_path, 0, 1, error_at=1000.0), 1: _failure(tmp_path, 1, -signal.SIGTERM),
                2: _failure(tmp_path, 2, -signal.SIGKILL)}
    assert elastic.root_cause(failures) == 2
    # without a killed rank, the earliest error wins, to the sub-second (torch's own timestamp is in seconds)
    failures = {0: _failure(tmp_path, 0, 1, error_at=1000.6), 1: _failure(tmp_path, 1, 1, error_at=1000.2),
                3: _failure(tmp_path, 3, -signal.SIGTERM)}
    assert elastic.root_cause(failures) == 1
    assert elastic.exit_status(failures[1]) == 1 and elastic.exit_status(failures[3]) == 128 + signal.SIGTERM


def test_a_killed_rank_stops_the_job_with_its_name_and_the_rerun_resumes(tmp_path):
    run_dir = tmp_path / "run"
    common = ["--run-dir", str(run_dir), "--steps", "16", "--ckpt-every", "4"]
    died = launch("torchrun.sh", [*common, "--kill-rank", "1", "--kill-at", "10"], tmp_path)
    assert died.returncode == 128 + signal.SIGKILL, died.stderr
    assert "infir-launch: rank 1 (local rank 1 on" in died.stderr
    assert "killed by signal 9 (SIGKILL); the job was stopped." in died.stderr
    (log_root,) = (tmp_path / "logs").iterdir()
    failure = json.loads((log_root / "failure.json").read_text())
    assert (failure["rank"], failure["signal"], failure["exit_status"]) == (1, "SIGKILL", 137)
    assert "rank 1: killing myself at step 10" in failure["stdout_tail"]
    for rank in (0, 1):  # every rank kept its own log
        (stdout,) = log_root.glob(f"*/attempt_0/{rank}/stdout.log")
        assert f"rank {rank}: step 9 acc" in stdout.read_text()
    assert json.loads((run_dir / "checkpoint.json").read_text())["step"] == 8
    assert not (run_dir / "summary.json").exists()

    resumed = launch("torchrun.sh", common, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "rank 0: resumed from step 8" in resumed.stdout and "rank 1: resumed from step 8" in resumed.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["acc"] == expected_acc(16, 2)  # no step lost, none counted twice
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [*range(1, 10), *range(9, 17)]  # step 9 ran before the crash and again after the resume


def test_a_raising_rank_is_named_with_its_error(tmp_path):
    died = launch("torchrun.sh", ["--run-dir", str(tmp_path / "run"), "--steps", "8", "--raise-rank", "1",
                                  "--raise-at", "3"], tmp_path)
    assert died.returncode == 1, died.stderr
    verdict = died.stderr[died.stderr.index("infir-launch: rank"):]
    assert verdict.startswith("infir-launch: rank 1 (local rank 1 on") and "exited with code 1" in verdict
    assert "RuntimeError: stand-in failure on purpose at step 3" in verdict


def test_multinode_script_names_missing_settings(tmp_path):
    done = launch("torchrun_multinode.sh", [], tmp_path, NNODES="2")
    assert done.returncode != 0 and "set MASTER_ADDR" in done.stderr


@pytest.fixture
def fake_slurm(tmp_path):
    """`srun` that starts its command once per node, locally, and `scontrol` that names this host."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env bash\n"
        'while [[ "${1:-}" == --* ]]; do shift; done\n'  # srun's own options
        "pids=()\n"
        'for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do SLURM_NODEID=$i "$@" & pids+=($!); done\n'
        'rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc\n')
    (bin_dir / "scontrol").write_text('#!/usr/bin/env bash\n[[ "$1 $2" == "show hostnames" ]] && echo localhost\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def test_slurm_template_runs_two_nodes_through_the_c10d_rendezvous(tmp_path, fake_slurm):
    run_dir = tmp_path / "run"
    done = launch("slurm.sbatch", ["--run-dir", str(run_dir), "--steps", "6"], tmp_path,
                  PATH=f"{fake_slurm}:{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="2",
                  SLURM_JOB_NODELIST="node[1-2]", SLURM_SUBMIT_DIR=str(REPO), NPROC_PER_NODE="1",
                  MASTER_PORT=str(free_port()))
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["acc"]) == (2, expected_acc(6, 2))
    node_logs = sorted((tmp_path / "logs" / "slurm-4242").iterdir())
    assert len(node_logs) == 2  # one launcher per node, each with its own per-rank logs
    stdouts = [next(d.glob("*/attempt_0/0/stdout.log")).read_text() for d in node_logs]
    ranks = sorted(line.split()[1] for text in stdouts for line in text.splitlines() if " on " in line)
    assert ranks == ["0/2", "1/2"]


def test_a_checkout_without_the_console_script_runs_the_module(tmp_path):
    """On a host where infir is only on PYTHONPATH (no `infir-train` on PATH), the launcher runs
    `$PYTHON -m infir.train.cli`: here its --help, on one rank."""
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "infir-train").exists())
    env = {k: v for k, v in os.environ.items() if k != "INFIR_CMD"}
    done = subprocess.run(["bash", str(REPO / "launch" / "torchrun.sh"), "--help"], cwd=REPO, timeout=120,
                          capture_output=True, text=True,
                          env={**env, "PATH": path, "PYTHON": sys.executable, "PYTHONPATH": str(REPO),
                               "INFIR_LOG_DIR": str(tmp_path / "logs"), "NPROC_PER_NODE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{sys.executable} -m infir.train.cli on" in done.stderr
