"""Synthetic run directories in the layout infir-train and launch/pipeline.sh write, for the report tests.
Curves are drawn from a seeded generator, and the FP8 run differs from the BF16 one by known factors, so
each test knows the truth it checks against. (A module of its own, not conftest.py: several conftest
modules exist in tests/, and `from conftest import` would pick whichever was imported first.)"""
import json
import math
import random
from pathlib import Path

# What the synthetic FP8 run differs by, relative to BF16: tests assert the report recovers these.
FP8_LOSS_GAP = 0.01  # +1 % loss
FP8_SPEEDUP = 1.15
FP8_MEMORY = 67.4 / 78.1


def write_run(run_dir: Path, model: str, precision: str, stage: str, steps: int = 120, seed: int = 0,
              loss_scale: float = 1.0, speed: float = 1.0, memory: float = 1.0, status: str = "finished",
              tokens_per_step: int = 4096, val_every: int = 20) -> Path:
    """metrics.jsonl + summary.json of one run."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []

    def row(step):
        tokens = step * tokens_per_step
        loss = loss_scale * (2.0 + 8.0 * math.exp(-tokens / 1e5)) * (1 + 0.01 * rng.uniform(-1, 1))
        return {"step": step, "consumed_tokens": tokens, "loss": loss, "lr": 1e-4, "grad_norm": 1.0,
                "tokens_per_s": 1000.0 * speed * (0.3 if step <= 3 else 1.0),  # slow first steps: warm-up
                "tflops": 300.0 * speed, "mfu": 0.3 * speed, "peak_mem_gib": 78.1 * memory,
                "elapsed_s": step * 0.5}

    def val(step):
        tokens = step * tokens_per_step
        return {"step": step, "consumed_tokens": tokens,
                "val_loss": loss_scale * (2.1 + 8.0 * math.exp(-tokens / 1e5))}

    for step in range(1, steps + 1):
        lines.append(row(step))
        if step % val_every == 0:
            lines.append(val(step))
    text = "\n".join(json.dumps(r) for r in lines) + "\n"
    (run_dir / "metrics.jsonl").write_text(text)
    (run_dir / "summary.json").write_text(json.dumps({
        "run_name": f"{model}-{precision}-{stage}", "model": model, "precision": precision,
        "optimizer": "adamw", "stage": stage, "status": status, "final_loss": lines[-1].get("loss")}))
    return run_dir


def make_demo_runs(tmp_path: Path) -> Path:
    """<tmp>/runs/<model>-<precision>/{cpt,sft1}/ + an eval summary per variant, as the pipeline lays them out."""
    root = tmp_path / "runs"
    for precision, scale, speed, memory, seed in [("bf16", 1.0, 1.0, 1.0, 1),
                                                  ("fp8_blockwise_ue8m0", 1 + FP8_LOSS_GAP, FP8_SPEEDUP, FP8_MEMORY, 2)]:
        for stage in ("cpt", "sft1"):
            write_run(root / f"tiny-{precision}" / stage, "tiny", precision, stage, seed=seed,
                      loss_scale=scale, speed=speed, memory=memory)
        (root / f"tiny-{precision}" / "eval").mkdir()
        avg = 0.50 if precision == "bf16" else 0.48
        (root / f"tiny-{precision}" / "eval" / "summary.json").write_text(json.dumps({  # infir-eval's format
            "label": f"tiny-{precision}", "model": "ckpt", "seed": 0, "overall": {"avg": avg},
            "benchmarks": {"demo_arith": {"problems": 20, "samples": 4, "avg@4": avg, "pass@1": avg, "pass@4": 0.75,
                                          "mean_tokens": 31.5, "truncated": 0}}}))
    return root
