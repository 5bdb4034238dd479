"""Push a rendered comparison to W&B: one `compare` run in the project holding the same plots, tables and page.

Online needs `WANDB_API_KEY` (or `wandb login`); with `mode="offline"` the run lands in `<out>/wandb/`
and `wandb sync` uploads it later.
"""
from __future__ import annotations

import math
from pathlib import Path

from infir.report.pairing import Pair, run_stats
from infir.report.runs import EvalResult, Run


def _clean(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def push(out_dir: Path, title: str, runs: list[Run], pairs: list[Pair], evals: list[EvalResult],
         plots: list[tuple[str, str, Path]], project: str, entity: str | None = None, mode: str = "online") -> str:
    """Log the report as one W&B run; returns the run's path (entity/project/id, or the offline dir)."""
    import wandb

    run = wandb.init(project=project, entity=entity, name=title, job_type="compare", mode=mode,
                     dir=str(out_dir), config={"runs": [r.name for r in runs]})
    try:
        run.log({f"plots/{slug}": wandb.Image(str(path), caption=caption) for slug, caption, path in plots})
        run_rows = [[r.name, r.model, r.precision, r.stage, *(_clean(v) for v in vars(run_stats(r)).values())] for r in runs]
        run.log({"runs": wandb.Table(columns=["run", "model", "precision", "stage", *vars(run_stats(runs[0]))],
                                     data=run_rows)})
        if pairs:
            summaries = [p.summary() for p in pairs]
            run.log({"comparisons": wandb.Table(columns=["comparison", *summaries[0]],
                                                data=[[p.label, *map(_clean, s.values())] for p, s in zip(pairs, summaries)])})
        if evals:
            metrics = sorted({k for e in evals for k in e.scores})
            run.log({"eval": wandb.Table(columns=["variant", *metrics],
                                         data=[[e.variant, *(e.scores.get(m) for m in metrics)] for e in evals])})
        page = wandb.Artifact(f"compare-report-{run.id}", type="report")
        page.add_file(str(out_dir / "index.html"))
        for _slug, _caption, path in plots:
            page.add_file(str(path), name=f"plots/{path.name}")
        run.log_artifact(page)
        return run.path if mode == "online" else str(Path(run.dir).parent)
    finally:
        run.finish()
