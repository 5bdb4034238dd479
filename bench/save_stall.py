#!/usr/bin/env python3
"""How long training stalls for a checkpoint: infir-train's asynchronous save (train.async_save) on a model
of real size, e.g. 7B at TP=2.

    torchrun --nproc-per-node 2 bench/save_stall.py --model qwen2.5-7b --parallel tp2 --out save_stall.md

Per mode (async; sync for comparison): the median of the steps before the save, the time save() takes to
return, the step right after it (the host copies run beside its forward and backward, the writer thread
beside all of it), and the time from save() until the checkpoint is committed. The stall is save()'s time
plus the step after's excess over the median. Written: the checkpoint's bytes, every rank's files. Async also
gives the host buffers' size and how long making them took (once, after the first step: not part of the stall).
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import base_parser, emit, markdown_table  # noqa: E402
from step import bench_config  # noqa: E402


def timed_step(trainer) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    trainer.train_step(trainer.step)
    torch.cuda.synchronize()
    trainer.step += 1
    return time.perf_counter() - start


def measure(mode: str, args, run_dir: str) -> dict:
    from infir.model import ckpt_format
    from infir.train.loop import Trainer

    cfg = bench_config(args.model, args.seq, 1, args.accum, "none", args.precision, 1000, args.parallel, run_dir)
    cfg.train.async_save = mode == "async"
    trainer = Trainer(cfg)
    steps = [timed_step(trainer) for _ in range(args.steps)]
    base = statistics.median(steps[1:])  # the first step compiles
    start = time.perf_counter()
    trainer.save()
    returned = time.perf_counter() - start
    after = timed_step(trainer)
    trainer.wait_save()  # a sync save() has already committed
    committed = time.perf_counter() - start
    written = sum(f.stat().st_size for f in ckpt_format.resolve(trainer.ckpt_root).iterdir())
    trainer.close()
    staged = {"staging made s": trainer.staging_seconds, "staging GB": trainer.staging_bytes / 1e9} if trainer.staging else {}
    return {"mode": mode, "step s": base, "save() s": returned, "step after s": after,
            "stall s": returned + max(after - base, 0.0), "until committed s": committed, "written GB": written / 1e9,
            **staged}


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-7b")
    p.add_argument("--parallel", default="tp2", help="a conf/parallel name; launch its ranks with torchrun")
    p.add_argument("--precision", default="bf16", help="as bench/step.py's cases take it (NAME[+OVERRIDE,...])")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=4, help="steps timed before the save")
    p.add_argument("--modes", nargs="+", default=["async"], choices=["async", "sync"])
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "infir_save_stall"),
                   help="where checkpoints are written (one folder every rank of this host sees; removed after)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("save_stall.py: needs a GPU (run it under torchrun with one process per GPU)")
    rows, rank = [], int(os.environ.get("RANK", "0"))
    # a folder of this launch's own (torchrun gives its ranks one id): a run dir holding checkpoints would resume
    here = os.path.join(args.dir, os.environ.get("TORCHELASTIC_RUN_ID", str(os.getpid())))
    for mode in args.modes:
        rows.append({"model": args.model, "parallel": args.parallel, "precision": args.precision,
                     **measure(mode, args, os.path.join(here, mode))})
        print(rows[-1], flush=True)
    if rank == 0:
        shutil.rmtree(here, ignore_errors=True)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        emit("Checkpoint stall: infir-train's save during training (bench/save_stall.py)",
             [f"{world} rank(s); seq {args.seq}, {args.accum} micro-batches a step; the checkpoint on the host's "
              "local disk; stall = save() + the next step's excess over the median step", markdown_table(rows)],
             args.out)


if __name__ == "__main__":
    main()
