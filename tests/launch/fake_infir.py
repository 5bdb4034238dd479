"""Stand-ins for `infir-train` and `infir-eval` that keep their on-disk contracts, so launch/pipeline.sh's
skip/resume logic is tested in seconds. Every call is appended to $FAKE_LOG as one JSON line.

    fake_infir.py train key=value...   run_dir gets metrics.jsonl, checkpoints/{iter_*,latest}, summary.json;
                                       with FAKE_INTERRUPT=<stage> a fresh run of that stage stops early
                                       with status "interrupted" (as train.exit_after does), and a run dir
                                       that holds a checkpoint is resumed from it
    fake_infir.py run key=value...     infir-eval run: out_dir/summary.json in infir-eval's format
"""
import json
import os
import sys
from pathlib import Path


def overrides(argv):
    return dict(arg.split("=", 1) for arg in argv)


def log(entry):
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps(entry) + "\n")


def train(cfg):
    run_dir = Path(cfg["run_dir"])
    ckpts = run_dir / "checkpoints"
    resumed_from = (ckpts / "latest").read_text().strip() if (ckpts / "latest").is_file() else None
    log({"cmd": "train", "stage": cfg["stage"], "precision": cfg["precision"], "init_from": cfg.get("init_from"),
         "resumed_from": resumed_from})
    if cfg.get("init_from") and not (Path(cfg["init_from"]) / "latest").is_file():
        sys.exit(f"fake infir-train: init_from={cfg['init_from']} holds no checkpoint")
    start = int(resumed_from.split("_")[1]) if resumed_from else 0
    stop = 5 if os.environ.get("FAKE_INTERRUPT") == cfg["stage"] and not resumed_from else 10
    scale = 1.01 if cfg["precision"] != "bf16" else 1.0
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "a") as f:
        for step in range(start + 1, stop + 1):
            f.write(json.dumps({"step": step, "consumed_tokens": 1000 * step, "loss": scale * 10 / step,
                                "tokens_per_s": 1000.0 * (1.15 if scale > 1 else 1.0)}) + "\n")
    (ckpts / f"iter_{stop:07d}").mkdir(parents=True, exist_ok=True)
    (ckpts / "latest").write_text(f"iter_{stop:07d}")
    status = "finished" if stop == 10 else "interrupted"
    (run_dir / "summary.json").write_text(json.dumps({
        "run_name": f"{cfg['model']}-{cfg['precision']}-{cfg['stage']}", "model": cfg["model"],
        "precision": cfg["precision"], "stage": cfg["stage"], "optimizer": "adamw", "status": status}))


def evaluate(cfg):
    log({"cmd": "eval", "model": cfg["model"], "label": cfg.get("label")})
    if not (Path(cfg["model"]) / "latest").is_file():
        sys.exit(f"fake infir-eval: model={cfg['model']} is no checkpoint")
    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({
        "label": cfg.get("label"), "model": cfg["model"], "overall": {"avg": 0.5}, "seed": 0,
        "benchmarks": {"demo_arith": {"problems": 16, "samples": 4, "avg@4": 0.5, "pass@1": 0.5, "pass@4": 0.75,
                                      "mean_tokens": 40.0, "truncated": 0}}}))


if __name__ == "__main__":
    command, rest = sys.argv[1], overrides(sys.argv[2:])
    train(rest) if command == "train" else evaluate(rest)
