"""Reports of a run (markdown table of summary.json), side-by-side comparison of runs, W&B logging."""
from __future__ import annotations

import json
from pathlib import Path

SAMPLE_COLUMNS = ("benchmark", "problem_id", "sample", "extracted", "answer", "correct", "num_tokens", "response")


def _fmt(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def summary_markdown(summary: dict) -> str:
    """One row per benchmark: problems, samples, avg@n, pass@k, mean response tokens, truncated."""
    metrics = []
    for result in summary["benchmarks"].values():
        metrics += [k for k in result if (k.startswith(("avg@", "pass@"))) and k not in metrics]
    header = ["benchmark", "problems", "samples", *metrics, "mean tokens", "truncated"]
    lines = [f"# {summary['label']}", "", f"model: `{summary['model']}`", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, r in summary["benchmarks"].items():
        cells = [name, r["problems"], r["samples"], *[r.get(m, "") for m in metrics], r["mean_tokens"], r["truncated"]]
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    lines.append(f"| **overall (mean avg@n)** | | | {_fmt(summary['overall']['avg'])} |" + " |" * (len(header) - 4))
    return "\n".join(lines) + "\n"


def load_summary(run: str | Path) -> dict:
    path = Path(run)
    path = path / "summary.json" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"{run}: no summary.json (is it an `infir-eval run` output directory?)")
    try:
        summary = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}): it is truncated or corrupt; "
                         "rerun the eval to write it again") from None
    if not (isinstance(summary, dict) and isinstance(summary.get("benchmarks"), dict)):
        raise ValueError(f"{path} is not an `infir-eval run` summary (no 'benchmarks' mapping)")
    return summary


def compare_markdown(summaries: list[dict], metric: str = "avg") -> str:
    """Runs as rows, benchmarks as columns (InfiR2 Table 5's shape, e.g. BF16 vs FP8), plus the
    difference of every run to the first. `metric`: "avg" (avg@n) or e.g. "pass@1"."""
    names = []
    for s in summaries:
        names += [b for b in s["benchmarks"] if b not in names]

    def value(s: dict, bench: str):
        result = s["benchmarks"].get(bench)
        if result is None:
            return None
        key = next((k for k in result if k.startswith("avg@")), None) if metric == "avg" else metric
        return result.get(key)

    header = ["run", *names, "overall"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    base = summaries[0]
    for s in summaries:
        cells = [s["label"]]
        for bench in names:
            v, b = value(s, bench), value(base, bench)
            if v is None:
                cells.append("-")
            elif s is base or b is None:
                cells.append(f"{v:.2f}")
            else:
                cells.append(f"{v:.2f} ({v - b:+.2f})")
        cells.append(f"{s['overall']['avg']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def log_wandb(summary: dict, rows: dict[str, list[dict]], project: str, mode: str = "offline",
              name: str | None = None) -> None:
    """Metrics as a run summary and every sample as a W&B Table per benchmark."""
    import wandb

    run = wandb.init(project=project, mode=mode, name=name or summary["label"], job_type="eval",
                     config={"model": summary["model"], "seed": summary["seed"]})
    for bench, result in summary["benchmarks"].items():
        run.summary.update({f"{bench}/{k}": v for k, v in result.items()})
        table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[r[c] for c in SAMPLE_COLUMNS] for r in rows[bench]])
        run.log({f"samples/{bench}": table})
    run.summary["overall/avg"] = summary["overall"]["avg"]
    run.finish()
