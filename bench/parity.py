"""FP8 vs BF16 loss parity: the same model, data, seed and steps under each precision recipe.

Trains `--model` (default small-180m: Qwen2.5-0.5B's layer shape at 12 layers, ~180M params) on the
demo's real text (Shakespeare + worked arithmetic), once per recipe, and reports the relative gap of
the smoothed training loss over the last 10% of steps against BF16, plus a PNG of the curves. Runs
log to W&B groups keyed by model+stage (logger=wandb_offline), so one dashboard shows them together.

    python bench/parity.py --steps 1000 --recipes bf16 fp8_blockwise_ue8m0 fp8_blockwise_fp32 fp8_tensorwise moss
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import base_parser, emit, markdown_table  # noqa: E402


def smoothed_tail(losses: list[float], frac: float = 0.1) -> float:
    n = max(1, int(len(losses) * frac))
    return float(np.mean(losses[-n:]))


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="small-180m")
    p.add_argument("--recipes", nargs="+", default=["bf16", "fp8_blockwise_ue8m0", "fp8_blockwise_fp32", "fp8_tensorwise", "moss"])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--root", default="outputs/parity")
    p.add_argument("--data-root", default=None, help="the demo data (built there on first use; default ROOT/data)")
    p.add_argument("--logger", default="none")
    args = p.parse_args()

    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer
    from infir.train.metrics import read_metrics

    curves, rows = {}, []
    for recipe in args.recipes:
        run_dir = Path(args.root) / f"{args.model}-{recipe}"
        cfg = compose([
            f"model={args.model}", f"precision={recipe}", f"logger={args.logger}", f"run_dir={run_dir}",
            f"data.root={args.data_root or Path(args.root) / 'data'}", f"stage.iters={args.steps}", f"stage.seq_length={args.seq}",
            f"stage.global_batch={args.global_batch}", f"stage.micro_batch={args.micro_batch}", f"stage.lr={args.lr}",
            f"stage.min_lr={args.lr / 10}", "stage.schedule=cosine", f"stage.warmup_iters={max(args.steps // 20, 1)}",
            "train.log_interval=1", f"train.eval_interval={args.steps}", f"train.save_interval={args.steps}",
            "train.fp8_health_interval=0",
        ])
        t0 = time.time()
        trainer = Trainer(cfg)
        last = trainer.train()
        curves[recipe] = [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r.get("loss") is not None]
        rows.append({"recipe": recipe, "steps": len(curves[recipe]), "final val loss": last.get("val_loss", float("nan")),
                     "tail loss (last 10%)": smoothed_tail(curves[recipe]), "minutes": (time.time() - t0) / 60})
        del trainer
    base = next((r for r in rows if r["recipe"] == "bf16"), None)
    for r in rows:
        if base:
            r["gap vs bf16 (%)"] = 100 * (r["tail loss (last 10%)"] - base["tail loss (last 10%)"]) / base["tail loss (last 10%)"]
    png = Path(args.root) / "parity.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for recipe, c in curves.items():
        k = max(1, len(c) // 50)
        ax.plot(np.convolve(c, np.ones(k) / k, mode="valid"), label=recipe)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (moving mean of {k})")
    ax.set_title(f"{args.model}: FP8 recipes vs BF16, same data and seed")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    emit("Loss parity, FP8 recipes vs BF16", [
        f"model {args.model}, seq {args.seq}, global batch {args.global_batch}, {args.steps} steps, lr {args.lr} cosine; demo text data; curves: {png}",
        markdown_table(rows)], args.out)
    distributed.shutdown()


if __name__ == "__main__":
    main()
