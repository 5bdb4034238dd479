"""Run `infir-train` in a subprocess the way users do (torchrun included) and read what it wrote."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_cmd(overrides: list[str], nproc: int = 1) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "infir.train.cli", *overrides]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
            "-m", "infir.train.cli", *overrides]


def run_train(overrides: list[str], nproc: int = 1, timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(train_cmd(overrides, nproc), cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"infir-train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def worker_rows(script: str, *args: str, nproc: int = 2, timeout: int = 600) -> list[dict]:
    """Run tests/train/`script` under torchrun and return the JSON line each rank printed (print_rows)."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
         str(REPO / "tests/train" / script), *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == nproc, proc.stdout[-3000:]
    return rows


def print_rows(result: dict) -> None:
    """A torchrun worker's report: one whole JSON line per rank, in turn (the ranks share one stdout pipe)."""
    import torch.distributed as dist

    line = json.dumps(result)
    for r in range(dist.get_world_size()):
        if r == dist.get_rank():
            print(line, flush=True)
        dist.barrier()


def losses(run_dir: Path) -> dict[int, float]:
    from infir.train.metrics import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(Path(run_dir) / "metrics.jsonl") if "loss" in r}


def summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def in_process_losses(runs: dict, steps: int) -> dict:
    """{name: the first `steps` losses} of each run, trained in this process from its overrides (a
    Trainer at a time, the process group shut down after), for comparing runs step by step."""
    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    out = {}
    try:
        for name, overrides in runs.items():
            trainer = Trainer(compose(overrides))
            out[name] = [trainer.train_step(i)["loss"] for i in range(steps)]
            trainer.close()
            del trainer
    finally:
        distributed.shutdown()
    return out
