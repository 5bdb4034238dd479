"""A stand-in for infir-train under torchrun, small enough for CPU tests of the launchers.

Each step all-reduces (gloo) a number every rank knows, so the final `acc` has a closed form the test
checks: any lost or doubled step after a crash and resume changes it. Like infir-train it writes
metrics.jsonl and summary.json into --run-dir, checkpoints every --ckpt-every steps (written atomically,
after a barrier, so a checkpoint is never half-written or ahead of a rank) and resumes from it.
--kill-rank/--kill-at make one rank SIGKILL itself (a node's OOM killer); --raise-rank/--raise-at
make it raise (a bug). main is wrapped in torch's @record, as infir-train's must be, so a raised
error reaches torchrun's error file and the launcher's verdict.
"""
import argparse
import json
import os
import signal
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def expected_acc(steps: int, world: int) -> float:
    """Sum over steps of the all-reduce of (rank + 1) * step: what an uninterrupted run accumulates."""
    return float(sum(step * world * (world + 1) // 2 for step in range(1, steps + 1)))


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ckpt-every", type=int, default=4)
    ap.add_argument("--step-time", type=float, default=0.05)
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--raise-rank", type=int, default=-1)
    ap.add_argument("--raise-at", type=int, default=-1)
    return ap.parse_args()


@record
def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = args.run_dir / "checkpoint.json"
    state = json.loads(ckpt.read_text()) if ckpt.is_file() else {"step": 0, "acc": 0.0}
    if state["step"]:
        print(f"rank {rank}: resumed from step {state['step']}", flush=True)
    print(f"rank {rank}/{world} on {socket.gethostname()} local rank {os.environ['LOCAL_RANK']}", flush=True)
    for step in range(state["step"] + 1, args.steps + 1):
        if rank == args.kill_rank and step == args.kill_at:
            print(f"rank {rank}: killing myself at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == args.raise_rank and step == args.raise_at:
            raise RuntimeError(f"stand-in failure on purpose at step {step}")
        value = torch.tensor([float((rank + 1) * step)])
        dist.all_reduce(value)
        state = {"step": step, "acc": state["acc"] + value.item()}
        print(f"rank {rank}: step {step} acc {state['acc']}", flush=True)
        if rank == 0:
            with open(args.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "consumed_tokens": step * 100, "loss": 1.0 / step}) + "\n")
        if step % args.ckpt_every == 0:
            dist.barrier()
            if rank == 0:
                tmp = ckpt.with_suffix(".tmp")
                tmp.write_text(json.dumps(state))
                os.replace(tmp, ckpt)
        time.sleep(args.step_time)
    if rank == 0:
        (args.run_dir / "summary.json").write_text(json.dumps(
            {"status": "finished", "acc": state["acc"], "world_size": world, "steps": args.steps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
