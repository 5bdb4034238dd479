"""Where a run reports: console progress, metrics.jsonl, summary.json, W&B (offline by default), loss.png."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from omegaconf import OmegaConf


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def format_si(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


class RunLogger:
    """Rank 0 writes; other ranks hold a disabled instance so call sites need no rank checks."""

    def __init__(self, cfg, run_dir: Path, enabled: bool):
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self.wandb = None
        self.start_time = time.time()
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        mode = wandb_mode(cfg.logger.wandb)
        if mode != "disabled":
            import wandb

            self.wandb = wandb.init(
                project=cfg.logger.project,
                name=cfg.run_name,
                group=f"{cfg.model.name}-{cfg.stage.name}",  # FP8 and BF16 runs of one model+stage side by side
                tags=[cfg.model.name, cfg.precision.name, cfg.stage.name, cfg.optimizer.name],
                config=OmegaConf.to_container(cfg, resolve=True),
                dir=str(self.run_dir),
                mode=mode,
                resume="allow",
                id=_wandb_id(self.run_dir),
            )

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if k != "step" and v is not None}, step=record["step"])

    def console(self, line: str) -> None:
        if self.enabled:
            print(line, flush=True)

    def summary(self, values: dict) -> None:
        if not self.enabled:
            return
        path = self.run_dir / "summary.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        old.update(values)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(old, indent=2))
        os.replace(tmp, path)
        if self.wandb is not None:
            self.wandb.summary.update({k: v for k, v in values.items() if isinstance(v, (int, float, str))})

    def plot(self) -> Path | None:
        if not self.enabled or not self.metrics_path.exists():
            return None
        return plot_loss(self.metrics_path, self.run_dir / "loss.png")

    def finish(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def wandb_mode(configured: str) -> str:
    """W&B's mode: $WANDB_MODE over logger.wandb's offline or online, as wandb itself reads it; but
    logger=none (disabled) means no W&B whatever the environment says."""
    if configured == "disabled":
        return configured
    return os.environ.get("WANDB_MODE") or configured


def _wandb_id(run_dir: Path) -> str:
    """A stable id per run dir, so a resumed run appends to the same W&B run."""
    path = run_dir / ".wandb_id"
    if path.exists():
        return path.read_text().strip()
    import uuid

    rid = uuid.uuid4().hex[:12]
    path.write_text(rid)
    return rid


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl, with the records a resumed run re-logged collapsed to the last of each step."""
    rows: dict[tuple, dict] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            kind = "val" if "val_loss" in r else ("loss" if "loss" in r else "other")
            rows[(r["step"], kind)] = r
    return [rows[k] for k in sorted(rows)]


def plot_loss(metrics_path: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in rows if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss")
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(Path(metrics_path).parent.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
