"""Load training runs and eval results into one shape, whatever wrote them.

A training run comes from either of
- our run dir: `metrics.jsonl` (train rows carry `loss`, validation rows carry `val_loss`) + `summary.json`;
- a W&B offline run dir (`offline-run-*/run-*.wandb`), read by `wandb_offline`.
Who a run is (model, precision, stage) comes from summary.json, else the W&B config, else the run
name `<model>-<precision>-<stage>` (our trainer's naming, e.g. `tiny-bf16-cpt`).

A resumed run logs again the steps after its last checkpoint; the later row of a step wins, so the
curve is the one the finished model actually followed.

An eval result is an `infir-eval` summary.json; its numeric leaves whose key names a score
(`avg@k`, `pass@k`, `acc`, `score`, ...) become `benchmark metric` -> value. Its model/precision come
from the training runs beside it (the pipeline writes `<out>/<model>-<precision>/{cpt,sft1,sft2,eval}`),
else from its label or its parent directory's name, `<model>-<precision>`.
"""
from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from infir.report.wandb_offline import read_offline_run

SCORE_KEY = re.compile(r"@|acc|score|pass|exact|match", re.IGNORECASE)


@dataclass
class Run:
    name: str
    model: str
    precision: str
    stage: str
    source: Path
    train: list[dict] = field(default_factory=list)  # rows with `loss`, sorted by step
    val: list[dict] = field(default_factory=list)  # rows with `val_loss`, sorted by step
    status: str = "unknown"

    @property
    def variant(self) -> str:
        return f"{self.model}-{self.precision}"

    @property
    def steps(self) -> int:
        """The last step the run logged (runs log every few steps, so not the number of rows)."""
        return int(self.train[-1]["step"]) if self.train else 0


@dataclass
class EvalResult:
    model: str
    precision: str
    source: Path
    scores: dict[str, float]

    @property
    def variant(self) -> str:
        return f"{self.model}-{self.precision}"


def _name_of(value) -> str | None:
    """A Hydra group may be resolved to its option name (a string) or to its node (a dict with `name`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return value["name"]
    return None


def identify(fields: dict, run_name: str) -> tuple[str, str, str]:
    """(model, precision, stage) from summary/config fields, falling back on the `<model>-<precision>-<stage>` name."""
    got = {k: _name_of(fields.get(k)) for k in ("model", "precision", "stage")}
    if all(got.values()):
        return got["model"], got["precision"], got["stage"]
    parts = run_name.rsplit("-", 2)
    if len(parts) != 3:
        raise ValueError(
            f"cannot tell model/precision/stage of run {run_name!r}: its summary/config lacks them and the name "
            "is not `<model>-<precision>-<stage>`; name runs like `tiny-bf16-cpt`"
        )
    return tuple(got[k] or p for k, p in zip(("model", "precision", "stage"), parts))


def _normalise_key(key: str) -> str:
    # W&B users often namespace metrics as train/loss, val/loss; ours are flat.
    if key.startswith("train/"):
        return key[len("train/"):]
    if key.startswith("val/"):
        return "val_" + key[len("val/"):]
    return key


def split_rows(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Train rows (with `loss`) and validation rows (with `val_loss`), one per step, last write wins, by step.
    Every row returned carries its `step` (W&B rows name it `_step`)."""
    train, val = {}, {}
    for i, raw in enumerate(rows):
        row = {_normalise_key(k): v for k, v in raw.items()}
        step = row.setdefault("step", row.get("_step", i))
        if row.get("loss") is not None:
            train[step] = row
        if row.get("val_loss") is not None:
            val[step] = row
    return [train[s] for s in sorted(train)], [val[s] for s in sorted(val)]


def read_jsonl(path: Path) -> list[dict]:
    try:
        lines = Path(path).read_text().splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err}): it is corrupt") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if n == len(lines):  # a run killed mid-write leaves a torn last line
                warnings.warn(f"{path}:{n}: dropping torn last line ({err})")
                continue
            raise ValueError(f"{path}:{n}: not a JSON line ({err}); metrics.jsonl holds one JSON object per line") from err
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: a JSON {type(row).__name__}, not an object; "
                             "metrics.jsonl holds one JSON object per line")
        rows.append(row)
    return rows


def read_json(path: Path) -> dict:
    """A JSON object from `path`; ValueError naming the file when it is truncated, corrupt or not an object."""
    try:
        value = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}): it is truncated or corrupt") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def load_run_dir(run_dir: Path) -> Run:
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    summary = read_json(summary_path) if summary_path.is_file() else {}
    name = summary.get("run_name") or run_dir.name
    model, precision, stage = identify(summary, name)
    train, val = split_rows(read_jsonl(run_dir / "metrics.jsonl"))
    return Run(name, model, precision, stage, run_dir, train, val, summary.get("status", "unknown"))


def load_wandb_dir(run_dir: Path) -> Run | None:
    """A W&B offline run as a Run; None for the runs infir-compare itself pushes (job_type "compare")."""
    off = read_offline_run(run_dir)
    if off.job_type == "compare":
        return None
    name = off.name or run_dir.name
    model, precision, stage = identify(off.config, name)
    train, val = split_rows(off.history)
    return Run(name, model, precision, stage, Path(run_dir), train, val, "finished" if off.finished else "running")


def _score_leaves(tree, prefix: str = "") -> dict[str, float]:
    out = {}
    for key, value in tree.items():
        label = f"{prefix} {key}".strip()
        if isinstance(value, dict):
            out.update(_score_leaves(value, label))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and SCORE_KEY.search(str(key)):
            out[label] = float(value)
    return out


def score_leaves(summary: dict) -> dict[str, float]:
    """Flatten an eval summary to `benchmark metric` -> value, keeping only keys that name a score.

    infir-eval writes {"benchmarks": {name: {"avg@n": .., "pass@k": .., "problems": ..}}, "overall": {"avg": ..}}:
    its benchmarks are the root, counts are dropped, and the overall mean is kept as `overall avg`.
    """
    if not isinstance(summary.get("benchmarks"), dict):
        return _score_leaves(summary)
    out = _score_leaves(summary["benchmarks"])
    overall = summary.get("overall")
    if isinstance(overall, dict) and isinstance(overall.get("avg"), (int, float)):
        out["overall avg"] = float(overall["avg"])
    return out


def _is_eval_summary(path: Path) -> bool:
    return path.name == "summary.json" and not (path.parent / "metrics.jsonl").exists() and path.parent.name != "files"


def discover(paths: list[Path]) -> tuple[list[Run], list[EvalResult]]:
    """Every run and eval result under the given paths (each a run dir, a W&B dir, or a folder of them)."""
    run_dirs, wandb_dirs, eval_files = set(), set(), set()
    for root in map(Path, paths):
        if not root.exists():
            raise FileNotFoundError(f"{root}: no such run directory")
        run_dirs |= {p.parent for p in [root / "metrics.jsonl", *root.rglob("metrics.jsonl")] if p.is_file()}
        wandb_dirs |= {p.parent for p in [*root.glob("run-*.wandb"), *root.rglob("run-*.wandb")]}
        eval_files |= {p for p in [root / "summary.json", *root.rglob("summary.json")] if p.is_file() and _is_eval_summary(p)}
    # A W&B dir inside one of our run dirs is the same run twice: our metrics file is the reference.
    wandb_dirs = {w for w in wandb_dirs if not any(r in w.parents for r in run_dirs)}
    runs = [load_run_dir(d) for d in sorted(run_dirs)]
    runs += [r for r in map(load_wandb_dir, sorted(wandb_dirs)) if r is not None]
    if not runs:
        raise FileNotFoundError(
            f"no runs under {', '.join(map(str, paths))}: expected metrics.jsonl (infir-train run dirs) "
            "or wandb/offline-run-*/run-*.wandb"
        )
    runs = _with_steps(runs)
    evals = [e for e in (load_eval(p, runs) for p in sorted(eval_files)) if e is not None]
    return runs, evals


def _with_steps(runs: list[Run]) -> list[Run]:
    """The runs that logged a training step; the others are left out with a warning (a run that has
    just started), or, when none has, the report is refused rather than drawn empty."""
    empty = [r for r in runs if not r.train]
    if len(empty) == len(runs):
        raise ValueError(f"no run has logged a training step (no row with a loss in "
                         f"{', '.join(str(r.source) for r in empty)})")
    for r in empty:
        warnings.warn(f"{r.source}: left out of the report: it has logged no training step")
    return [r for r in runs if r.train]


def load_eval(path: Path, runs: list[Run]) -> EvalResult | None:
    summary = read_json(path)
    scores = score_leaves(summary)
    if not scores:
        return None
    siblings = [r for r in runs if r.source.parent == path.parent.parent]
    if siblings:
        return EvalResult(siblings[0].model, siblings[0].precision, Path(path), scores)
    for name in (summary.get("label"), path.parent.parent.name):  # the pipeline labels evals <model>-<precision>
        parts = str(name or "").rsplit("-", 1)
        if len(parts) == 2:
            return EvalResult(parts[0], parts[1], Path(path), scores)
    warnings.warn(f"{path}: eval summary skipped: no training run beside it, and neither its label nor its folder "
                  "is <model>-<precision>")
    return None
