"""FP8 vs BF16 loss parity: the same model, data, seed and steps under each precision recipe.

Trains `--model` (default small-180m: Qwen2.5-0.5B's layer shape at 12 layers, ~180M params) on the
demo's real text (Shakespeare + worked arithmetic), once per recipe, and reports the relative gap of
the smoothed training loss over the last 10% of steps against BF16, plus a PNG of the curves. Runs
log to W&B groups keyed by model+stage (logger=wandb_offline), so one dashboard shows them together.

    python bench/parity.py --steps 1000 --recipes bf16 fp8_blockwise_ue8m0 fp8_blockwise_fp32 fp8_tensorwise moss

`--jobs N` trains up to N recipes at once, each in its own process: a ~180M model leaves most of an
H100 idle, so recipes that share one GPU finish much sooner than one after another. The numbers do
not depend on it (each run has its own seed-determined data order and no cross-process state). `--seeds A B C` trains
every recipe once per seed and reports each gap as the mean over seed-paired runs, with its spread
and BF16's own seed-to-seed spread: at these sizes one seed's gap moves by about the 1% target.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import base_parser, emit, markdown_table  # noqa: E402


def smoothed_tail(losses: list[float], frac: float = 0.1) -> float:
    n = max(1, int(len(losses) * frac))
    return float(np.mean(losses[-n:]))


def curve_from_log(log: Path) -> tuple[list[float], list[float]]:
    """Training and validation losses as the trainer printed them (train.log_interval=1)."""
    text = log.read_text()
    losses = [float(v) for v in re.findall(r"^step \d+/\d+ \| loss ([0-9.eE+-]+|nan|inf)", text, re.M)]
    vals = [float(v) for v in re.findall(r"^step \d+ \| validation loss ([0-9.eE+-]+|nan|inf)", text, re.M)]
    return losses, vals


DEFAULT_SEED = 1234  # conf/config.yaml's; runs of other seeds carry theirs in their names


def run_name(args, recipe: str, seed: int) -> str:
    return f"{args.model}-{recipe}" + ("" if seed == DEFAULT_SEED else f"-s{seed}")


def run_dir_of(args, recipe: str, seed: int) -> Path:
    return Path(args.root) / run_name(args, recipe, seed)


def data_root(args) -> Path:
    return Path(args.data_root) if args.data_root else Path(args.root) / "data"


def train_one(args, recipe: str, seed: int) -> None:
    """Train one recipe; its metrics.jsonl and wall time (parity_time.json) land in its run dir."""
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    run_dir = run_dir_of(args, recipe, seed)
    cfg = compose([
        f"seed={seed}", f"model={args.model}", f"precision={recipe}", f"logger={args.logger}", f"run_dir={run_dir}",
        f"data.root={data_root(args)}", f"stage.iters={args.steps}", f"stage.seq_length={args.seq}",
        f"stage.global_batch={args.global_batch}", f"stage.micro_batch={args.micro_batch}", f"stage.lr={args.lr}",
        f"stage.min_lr={args.lr / 10}", "stage.schedule=cosine", f"stage.warmup_iters={max(args.steps // 20, 1)}",
        "train.log_interval=1", f"train.eval_interval={args.steps}", f"train.save_interval={args.steps}",
        "train.eval_iters=20",  # the validation size of the recorded parity runs (the demo scale's is 4)
        "train.fp8_health_interval=0",
    ])
    t0 = time.time()
    Trainer(cfg).train()
    (run_dir / "parity_time.json").write_text(json.dumps({"minutes": (time.time() - t0) / 60}))


def train_all(args) -> None:
    """Each (recipe, seed) in a subprocess, up to --jobs at a time; a failed run names its log."""
    from infir.data.demo import ensure_demo_data

    ensure_demo_data(data_root(args))  # once, before concurrent runs would race to build it
    pending, running, failed = [(r, s) for s in args.seeds for r in args.recipes], [], []
    while pending or running:
        while pending and len(running) < args.jobs:
            recipe, seed = pending.pop(0)
            log = Path(args.root) / f"{run_name(args, recipe, seed)}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, __file__, "--train-only", "--recipes", recipe, "--seeds", str(seed), "--model", args.model,
                   "--steps", str(args.steps), "--seq", str(args.seq), "--global-batch", str(args.global_batch),
                   "--micro-batch", str(args.micro_batch), "--lr", str(args.lr), "--root", args.root,
                   "--data-root", str(data_root(args)), "--logger", args.logger]
            running.append((f"{recipe} seed {seed}", log, subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)))
        time.sleep(2)
        for item in [r for r in running if r[2].poll() is not None]:
            running.remove(item)
            if item[2].returncode != 0:
                failed.append(f"{item[0]} (exit {item[2].returncode}, log {item[1]})")
    if failed:
        raise SystemExit("parity runs failed: " + ", ".join(failed))


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="small-180m")
    p.add_argument("--recipes", nargs="+", default=["bf16", "fp8_blockwise_ue8m0", "fp8_blockwise_fp32", "fp8_tensorwise", "moss"])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seq", type=int, default=512)
    # 1000 steps x 4 x 512 = 2.0M tokens: within one pass over the demo text (~2.8M tokens), so the
    # training loss is a held-out loss. At 32 sequences a step the runs would see the text several times
    # and the "gap" would measure how fast each recipe memorises it, not its quality.
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seeds", nargs="+", type=int, default=[DEFAULT_SEED],
                   help="several seeds give each gap as a mean over seed-paired runs, with its spread and "
                        "BF16's own seed-to-seed spread beside it (one seed cannot tell a 1%% gap from noise)")
    p.add_argument("--root", default="outputs/parity")
    p.add_argument("--data-root", default=None, help="the demo data (built there on first use; default ROOT/data)")
    p.add_argument("--logger", default="none")
    p.add_argument("--jobs", type=int, default=1, help="recipes trained at once, one process each")
    p.add_argument("--train-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: report the runs already under --root (e.g. recipes trained in separate calls)")
    args = p.parse_args()

    from infir.train import dist as distributed

    if args.jobs > 1 and not (args.train_only or args.report_only):
        train_all(args)
    elif not args.report_only:
        for seed in args.seeds:
            for recipe in args.recipes:
                train_one(args, recipe, seed)
        distributed.shutdown()
        if args.train_only:
            return

    curves, rows = {}, []
    tails: dict[str, list[float]] = {}
    for recipe in args.recipes:
        runs = [load_run(args, recipe, seed) for seed in args.seeds]
        tails[recipe] = [smoothed_tail(c) for c, _, _ in runs]
        curves[recipe] = np.mean([c for c, _, _ in runs], axis=0) if len({len(c) for c, _, _ in runs}) == 1 else runs[0][0]
        vals = [v[-1] for _, v, _ in runs if v]
        rows.append({"recipe": recipe, "seeds": len(runs), "steps": len(runs[0][0]),
                     "final val loss": float(np.mean(vals)) if vals else float("nan"),
                     "tail loss (last 10%)": float(np.mean(tails[recipe])),
                     "minutes": float(np.mean([m for _, _, m in runs]))})
    notes = []
    if "bf16" in tails:
        base = tails["bf16"]
        for r in rows:
            # paired by seed: the same init and data order on both sides of each difference
            gaps = [100 * (t - b) / b for t, b in zip(tails[r["recipe"]], base)]
            r["gap vs bf16 (%)"] = float(np.mean(gaps))
            if len(gaps) > 1:
                r["gap std over seeds (%)"] = float(np.std(gaps, ddof=1))
        if len(base) > 1:
            notes.append(f"BF16's own tail loss varies by {100 * np.std(base, ddof=1) / np.mean(base):.2f}% "
                         f"(std over its {len(base)} seeds, of the mean): a gap inside that is noise")
    # beside the report, where bench/report.py finds the figure of the run it shows
    png = Path(args.out).with_suffix(".png") if args.out else Path(args.root) / "parity.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for recipe, c in curves.items():
        k = max(1, len(c) // 50)
        ax.plot(np.convolve(c, np.ones(k) / k, mode="valid"), label=recipe)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (moving mean of {k})")
    seeds = "seed" if len(args.seeds) == 1 else f"mean of {len(args.seeds)} seeds"
    ax.set_title(f"{args.model}: FP8 recipes vs BF16, same data and {seeds}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    how_run = ("runs trained earlier, reported by --report-only" if args.report_only
               else f"{min(args.jobs, len(args.recipes) * len(args.seeds))} run(s) at a time on one device")
    emit("Loss parity, FP8 recipes vs BF16", [
        f"model {args.model}, seq {args.seq}, global batch {args.global_batch}, {args.steps} steps, lr {args.lr} cosine; "
        f"demo text data; {how_run} (minutes are each run's wall time, longer where runs shared the GPU); "
        f"curves: {png}; seeds: {' '.join(map(str, args.seeds))}", *notes,
        markdown_table(rows)], args.out)


def load_run(args, recipe: str, seed: int) -> tuple[list[float], list[float], float]:
    """(training losses, validation losses, minutes) of one finished run, from its run dir or, where
    only the console log came back from the GPU host (run dirs are too deep to fetch), from the log."""
    from infir.train.metrics import read_metrics

    run_dir = run_dir_of(args, recipe, seed)
    if (run_dir / "metrics.jsonl").exists():
        records = read_metrics(run_dir / "metrics.jsonl")
        losses = [r["loss"] for r in records if r.get("loss") is not None]
        vals = [r["val_loss"] for r in records if r.get("val_loss") is not None]
        return losses, vals, json.loads((run_dir / "parity_time.json").read_text())["minutes"]
    log = Path(args.root) / f"{run_name(args, recipe, seed)}.log"
    if not log.exists():
        raise SystemExit(f"no run of {recipe} (seed {seed}) under {args.root}: neither {run_dir / 'metrics.jsonl'} "
                         f"nor {log} exists; train it first (drop --report-only) or pass the --root it was trained under")
    losses, vals = curve_from_log(log)
    return losses, vals, float("nan")


if __name__ == "__main__":
    main()
