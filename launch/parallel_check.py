#!/usr/bin/env python3
"""Do TP=2 and DP=2 train like one rank? Same run three times through launch/torchrun.sh, then a table.

    python launch/parallel_check.py --out outputs/parallel_check -- model=tiny stage.iters=50
    python launch/parallel_check.py --out outputs/parallel_check --md BENCH_parallel.md -- model=qwen2.5-0.5b ...

Layouts: `single` (1 rank), `tp2` (2 ranks, parallel=tp2: tensor + sequence parallel), `dp2` (2 ranks,
parallel=single: data parallel, optimizer states sharded), `dp2_replicated` (the same with replicated states),
`cp2` (2 ranks, parallel.cp=2: context parallel), `tp2dp2` (4 ranks: TP=2 x DP=2). Every layout sees the
same global batch, so the loss curves must agree up to reduction order (bf16: ~1e-2 relative; fp32: ~1e-5). The table gives per layout: steps compared,
max relative loss difference vs single, the first step's gradient-norm difference, whether both are within
--loss-tol and --grad-tol, final loss, median tokens/s after warm-up and ratio vs single, peak memory; headed
by device, versions, the exact command and the date: what a reader needs to compare the figures with other
runs and to reproduce them. A layout outside the tolerances makes the exit status 1. The first step's gradient
norm is the sharp test: a layout whose gradients are wrong can start on the same loss and, over a short run on
data the model barely learns, stay within a percent of the single rank's curve.
A layout whose run dir already holds a finished run is not re-run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAYOUTS = {"single": (1, ["parallel=single"]), "tp2": (2, ["parallel=tp2"]), "dp2": (2, ["parallel=single"]),
           "cp2": (2, ["parallel=single", "parallel.cp=2"]), "tp2dp2": (4, ["parallel=tp2"]),
           "dp2_replicated": (2, ["parallel=single", "optimizer.distributed=false"])}
WARMUP_FRACTION = 0.1


def train_rows(metrics: Path) -> dict[int, dict]:
    """Train rows of a metrics.jsonl by step (a resumed run's later row of a step wins)."""
    rows = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if row.get("loss") is not None:
            rows[row["step"]] = row
    return rows


def median_after_warmup(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    values = sorted(values[int(len(values) * WARMUP_FRACTION):])
    if not values:
        return math.nan
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def compare(reference: dict[int, dict], other: dict[int, dict]) -> dict:
    """Loss agreement on the steps both logged, and the other run's speed and memory."""
    steps = sorted(set(reference) & set(other))
    if not steps:
        raise ValueError("the two runs logged no common step: give them the same train.log_interval")
    rel = [abs(other[s]["loss"] - reference[s]["loss"]) / abs(reference[s]["loss"]) for s in steps]
    mem = [r.get("peak_mem_gib") for r in other.values() if r.get("peak_mem_gib") is not None]
    g, want = other[steps[0]].get("grad_norm"), reference[steps[0]].get("grad_norm")
    return {
        "steps": len(steps),
        "max_rel_loss_diff": max(rel),
        "grad_norm_rel_diff": abs(g - want) / abs(want) if g is not None and want else math.nan,
        "final_loss": other[steps[-1]]["loss"],
        "tokens_per_s": median_after_warmup([other[s].get("tokens_per_s") for s in sorted(other)]),
        "peak_mem_gib": max(mem) if mem else math.nan,
    }


def agrees(result: dict, loss_tol: float, grad_tol: float) -> bool:
    """Within the tolerances: the loss curve, and the first step's gradient norm where both runs logged one."""
    g = result["grad_norm_rel_diff"]
    return result["max_rel_loss_diff"] <= loss_tol and (math.isnan(g) or g <= grad_tol)


def table(results: dict[str, dict], header: list[str], loss_tol: float, grad_tol: float) -> str:
    base_tps = results["single"]["tokens_per_s"]
    lines = [*header, "",
             "| layout | ranks | steps | max rel. loss diff vs single | first-step grad-norm diff | agrees | final loss "
             "| tokens/s | vs single | peak mem (GiB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        ratio = r["tokens_per_s"] / base_tps if base_tps else math.nan
        verdict = "yes" if agrees(r, loss_tol, grad_tol) else "**no**"
        lines.append(f"| {name} | {LAYOUTS[name][0]} | {r['steps']} | {r['max_rel_loss_diff']:.2e} "
                     f"| {r['grad_norm_rel_diff']:.2e} | {verdict} | {r['final_loss']:.4f} "
                     f"| {r['tokens_per_s']:.4g} | {ratio:.2f}x | {r['peak_mem_gib']:.2f} |")
    lines += ["", f"tolerances: loss {loss_tol:g} relative at every step, first-step gradient norm {grad_tol:g} relative"]
    return "\n".join(lines)


def environment(command: str) -> list[str]:
    import torch

    gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if gpu else f"CPU ({platform.processor() or platform.machine()})"
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpu else "-"
    return [f"device: {device} x {torch.cuda.device_count() or 1}",
            f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}",
            f"command: `{command}`", f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}"]


def run_layout(name: str, out: Path, overrides: list[str]) -> Path:
    nproc, parallel = LAYOUTS[name]
    run_dir = out / name
    summary = run_dir / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("status") == "finished":
        return run_dir
    env = {**os.environ, "NPROC_PER_NODE": str(nproc), "INFIR_LOG_DIR": str(run_dir / "logs")}
    subprocess.run(["bash", str(HERE / "torchrun.sh"), *parallel, *overrides, f"run_dir={run_dir}"], env=env, check=True)
    return run_dir


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, overrides = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/parallel_check"))
    ap.add_argument("--layouts", default="single,tp2,dp2", help="comma-separated, single first")
    ap.add_argument("--md", type=Path, help="also write the table to this file")
    ap.add_argument("--loss-tol", type=float, default=1e-2,
                    help="largest relative loss difference from single at any step (default: BF16's reduction-order spread)")
    ap.add_argument("--grad-tol", type=float, default=0.05,
                    help="largest relative difference of the first step's gradient norm from single")
    args = ap.parse_args(ours)
    names = args.layouts.split(",")
    if names[0] != "single" or not set(names) <= set(LAYOUTS):
        ap.error(f"--layouts: start with single, choose from {sorted(LAYOUTS)}")
    try:
        dirs = {name: run_layout(name, args.out, overrides) for name in names}
    except subprocess.CalledProcessError as err:
        print(f"parallel_check: a layout failed (exit {err.returncode}); its verdict is above", file=sys.stderr)
        return 1
    rows = {name: train_rows(d / "metrics.jsonl") for name, d in dirs.items()}
    results = {name: compare(rows["single"], r) for name, r in rows.items()}
    text = table(results, environment(shlex.join(["python", "launch/parallel_check.py", *argv])), args.loss_tol, args.grad_tol)
    print(text)
    if args.md:
        args.md.write_text(text + "\n")
    off = [name for name, r in results.items() if not agrees(r, args.loss_tol, args.grad_tol)]
    if off:
        print(f"parallel_check: {', '.join(off)} did not train as one rank (outside --loss-tol/--grad-tol, table above)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
