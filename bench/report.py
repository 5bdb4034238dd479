"""BENCHMARKS.md, generated from the result files under bench/results/ (see bench/result_file.py).

    python3 bench/report.py            # rewrite BENCHMARKS.md from the results
    python3 bench/report.py --check    # exit 1 when BENCHMARKS.md is not what the results generate

A result file is one run of one bench script: bench/results/<date>-<commit>/<kind>.json, its kind the
report's name (step_1.5b, linear_graph, quant, parity, ...). The page copies figures from those files and
writes no figure of its own: the training-step tables take each row (model, parallelism, device, seq,
recompute, precision) from the newest run that measured it, with the ratios to BF16 and to the HF peers
that this run printed; the other sections show the newest run of each kind. Each row names its run (date,
commit, device, command), so every figure can be traced to the file and reproduced.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from peak_memory import graphs_by_default, held_peak_GiB

REPO = Path(__file__).resolve().parents[1]

METHOD = """\
**The ceiling.** FP8 speeds up only the transformer blocks' GEMMs. bench/step.py profiles the BF16 step and \
takes `f_block_gemm`, the share of its GPU time spent in those GEMMs (the LM head's GEMMs excluded: they stay \
in BF16), and times the blockwise FP8 and the BF16 GEMMs alone at the model's shapes for their speedup \
`r_fp8_gemm`. The Amdahl bound of the FP8 step is then `1 / ((1 - f) + f / r)`: the speedup FP8 would reach if \
its GEMMs ran at the measured FP8 speed and everything else (attention, norms, the optimizer, quantization) \
cost what it costs in BF16. "% of ceiling" is the measured FP8/BF16 speedup over that bound; above 100% means \
FP8 also shortened work outside the GEMMs (a SwiGLU fused into its quantizers).

**The step.** bench/step.py builds the trainer itself (megatron-core GPTModel from infir's layer spec, \
per-layer torch.compile, the chunked LM-head loss) on synthetic tokens. It runs three steps to warm up \
(compilation, autotuning), then times whole optimizer steps (every micro-batch of the gradient accumulation, \
the optimizer and, for FP8, the weights' re-quantization), each from its start to a device synchronize, and \
reports the median. Tokens/s counts every token of the step; TFLOP/s and MFU are per GPU, from the model's \
FLOPs per token, MFU over the dense BF16 peak named in bench/step.py (`SPEC_PEAK`). Peak memory is the most \
torch's caching allocator held over the case (`max_memory_reserved`), which counts the CUDA-graphed layers' \
memory pool; runs that recorded only the peak of allocated tensors show it where no graphs ran (lower by the \
allocator's slack) and nothing where they did, since graph replays use their pool without allocating. Every \
ratio compares two cases of one run, on one machine. The HF peers \
are the same model in HF transformers trained the same way (per-layer torch.compile, BF16 autocast, fused \
AdamW, SDPA attention): in BF16, and with torchao's float8 training (tensorwise scales) on the block linears."""


@dataclass(frozen=True)
class Run:
    """One result file: a bench script's report on one machine."""
    kind: str
    folder: Path
    env: dict
    notes: list
    tables: list

    def rows(self, column: str) -> list[dict]:
        """The rows of the first table that has this column."""
        return next((t["rows"] for t in self.tables if column in t["columns"]), [])


def load_run(path: Path) -> Run:
    """One result file (bench/results/<date>-<commit>/<kind>.json)."""
    return Run(path.stem, path.parent, **{k: v for k, v in json.loads(path.read_text()).items() if k != "title"})


def load_runs(*folders: Path) -> list[Run]:
    """Every result file under the folders (a file reached twice is read once), oldest first (by the date its
    report printed), but those withdrawn: a note "withdrawn: why" keeps a run measured wrong on record
    without its figures standing beside current ones."""
    paths = {p.resolve(): p for folder in folders for p in sorted(folder.glob("*/*.json"))}
    runs = [run for run in map(load_run, paths.values()) if not any(n.startswith("withdrawn: ") for n in run.notes)]
    return sorted(runs, key=lambda r: (r.env.get("date", ""), str(r.folder), r.kind))


CAVEAT = "caveat: measured before commit"


def measured_before_a_fix(run: Run, row: dict | None = None) -> bool:
    """Whether a caveat says the run (or, given, this row of it) measured code that a later commit corrected:
    its figures describe neither the code as it is nor what the step should cost. A caveat that names a case
    ("caveat: measured before commit C, case PRECISION: why") holds for that case's rows only, not the run."""
    for note in run.notes:
        if not note.startswith(CAVEAT):
            continue
        case = re.match(CAVEAT + r" \w+, case (\S+):", note)
        if case is None or (row is not None and row.get("precision") == case.group(1)):
            return True
    return False


def fmt(v) -> str:
    if v is None:
        return ""
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def table(columns: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(fmt(v) for v in row) + " |" for row in rows)]


def run_line(run: Run, page_dir: Path) -> str:
    env = run.env
    return (f"{env.get('date', '?')} UTC, commit {env.get('commit', '?')}, {env.get('device', '?')}; result file "
            f"`{os.path.relpath(run.folder / (run.kind + '.json'), page_dir)}`: `{command(run)}`")


def command(run: Run) -> str:
    """The command as printed, after the launch settings it ran under; a run of several ranks as torchrun
    launched it."""
    cmd = run.env.get("command", "")
    ranks = world_size(run)
    if ranks > 1 and cmd.startswith("python "):
        cmd = f"python -m torch.distributed.run --standalone --nproc_per_node {ranks} {cmd[len('python '):]}"
    return " ".join(filter(None, [run.env.get("environment"), cmd]))


def parallel_line(run: Run) -> str:
    """bench/step.py's 'parallel: NAME, N rank(s); ...' line (older reports print none: one GPU)."""
    lines = [*run.notes, *(tab["caption"] for tab in run.tables)]
    return next((line for line in lines if line.startswith("parallel: ")), "")


def world_size(run: Run) -> int:
    m = re.search(r"(\d+) rank\(s\)", parallel_line(run))
    return int(m.group(1)) if m else 1


def parallel(run: Run) -> str:
    m = re.match(r"parallel: ([^,]+),", parallel_line(run))
    return m.group(1) if m else "single"


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def ran_tp_overlap(row: dict) -> bool:
    """Whether a step row split its TP collectives around their GEMMs (parallel.tp_comm_overlap): its own record
    (bench/step.py), else its override; rows of neither ran with the trainer's default of their time, off."""
    if "tp_comm_overlap" in row:
        return str(row["tp_comm_overlap"]) == "True"  # a result file's cells are as its report printed them
    return "parallel.tp_comm_overlap=true" in str(row.get("precision", "")).partition("+")[2].split(",")


@functools.lru_cache(maxsize=None)
def parallel_conf(name: str) -> dict:
    """conf/parallel/NAME.yaml as the trainer reads it today ({} where there is no such layout)."""
    import yaml

    path = REPO / "conf" / "parallel" / f"{name}.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def shown_precision(run: Run, row: dict) -> str:
    """A row's precision as the trainer would need it today: with parallel.tp_comm_overlap=false added where the
    row ran its sequence-parallel collectives without the overlap on a layout whose conf/parallel now turns it on."""
    precision = str(row["precision"])
    conf = parallel_conf(parallel(run))
    overrides = precision.partition("+")[2].split(",")
    if ran_tp_overlap(row) or any(o.startswith("parallel.tp_comm_overlap=") for o in overrides) \
            or not conf.get("tp_comm_overlap") or not conf.get("sequence_parallel") \
            or "parallel.sequence_parallel=false" in overrides:
        return precision
    return precision + ("," if "+" in precision else "+") + "parallel.tp_comm_overlap=false"


def step_rows(runs: list[Run]) -> dict[tuple, tuple[Run, dict]]:
    """(model, parallel, device, seq, recompute, precision) -> (run, row), the newest run of each winning. The
    precision is the one shown (shown_precision): a row that named no overlap competes with one that named the
    overlap it ran without."""
    newest = {}
    for run in runs:
        if not run.kind.startswith("step") or run.kind.startswith("step_dp"):  # the DP section shows those
            continue
        for row in run.rows("step_ms"):
            if is_number(row.get("step_ms")):
                key = (row["model"], (parallel(run), world_size(run)), run.env.get("device", "?"), row["seq"],
                       row["recompute"], shown_precision(run, row))
                newest[key] = (run, row)
    return newest


def same_run(run: Run, column: str, row: dict, **match) -> dict:
    """The row of run's table holding `column` that matches row's model, seq and recompute and `match`."""
    for r in run.rows(column):
        if all(r.get(k) == row.get(k) for k in ("model", "seq", "recompute")) and \
                all(r.get(k) == v for k, v in match.items()):
            return r
    return {}


STEP_COLUMNS = ["seq", "recompute", "precision", "step ms", "tokens/s", "TFLOP/s per GPU", "Megatron-LM count",
                "MFU", "vs BF16", "% of ceiling", "memory vs BF16", "peak GiB", "run"]


def step_table(entries: list[tuple[Run, dict]], label) -> list[str]:
    rows = []
    for run, row in entries:
        ratio = same_run(run, "speedup vs bf16", row, precision=row["precision"])
        if measured_before_a_fix(run, {"precision": ratio.get("bf16 base")}):
            ratio = {}  # against a BF16 row its run's caveat says a later fix changed
        mfu = row.get("MFU(spec)")
        rows.append([row["seq"], row["recompute"], shown_precision(run, row), row["step_ms"], row.get("tokens/s"),
                     row.get("TFLOP/s"), row.get("TFLOP/s (Megatron-LM count)"), f"{100 * mfu:.1f}%" if is_number(mfu) else None,
                     ratio.get("speedup vs bf16"), ratio.get("% of ceiling"), memory_ratio(row, ratio),
                     held_peak_GiB(row), label(run)])
    return table(STEP_COLUMNS, rows)


def memory_ratio(row: dict, ratio: dict) -> float | None:
    """The run's FP8-vs-BF16 memory ratio, where the row's own peak is known (peak_memory.py): a result's
    ratio is of held peaks where it recorded them, else of allocated ones, which miss graph pools."""
    return ratio.get("memory vs bf16") if held_peak_GiB(row) is not None else None


PEER_COMPARED = ("bf16", "fp8_blockwise_ue8m0")  # infir's BF16 and its default FP8 recipe; the others: result files


def peer_table(entries: list[tuple[Run, dict]], label) -> list[str]:
    """infir's BF16 and default FP8 vs each HF peer, as printed by the run that measured the peer row shown."""
    rows = []
    for run, row in entries:
        if not str(row["precision"]).startswith("hf_"):
            continue
        for r in run.rows("tokens/s vs peer"):
            same_shape = (r.get("seq"), r.get("recompute")) == (row["seq"], row["recompute"])
            if r.get("HF peer") == row["precision"] and same_shape and r.get("infir precision") in PEER_COMPARED:
                rows.append([r["seq"], r["infir precision"], r["HF peer"], r["tokens/s vs peer"], label(run)])
    return ["", "infir vs the HF transformers peers, same run:", "", *table(
        ["seq", "infir precision", "HF peer", "tokens/s vs peer", "run"], rows)] if rows else []


def precision_order(key: tuple) -> tuple:
    model, par, device, seq, recompute, precision = key
    family = 2 if str(precision).startswith("hf_") else 0 if str(precision).startswith("bf16") else 1
    return seq, recompute != "none", recompute, family, precision


def step_section(runs: list[Run], page_dir: Path) -> tuple[list[str], list[Run]]:
    newest = step_rows(runs)
    labels: dict[int, str] = {}
    shown: list[Run] = []

    def label(run: Run) -> str:
        if id(run) not in labels:
            labels[id(run)] = chr(ord("a") + len(labels)) if len(labels) < 26 else f"r{len(labels)}"
            shown.append(run)
        return labels[id(run)]

    out = ["## Training step (bench/step.py)", "",
           "Each row comes from the newest run that measured it (its `run`, listed below the tables), so rows of "
           "one table may come from different commits and machines. The `vs BF16`, `% of ceiling` and `memory vs "
           "BF16` columns, and the peer ratios, compare two cases of that one run. `Megatron-LM count` is the same "
           "throughput in TFLOP/s per GPU as Megatron-LM counts FLOPs (its `num_floating_point_operations`: the whole "
           "[s, s] score square), the count of Megatron-based reports such as InfiR2's Table 6.", ""]
    for group in sorted({k[:3] for k in newest}):
        keys = sorted((k for k in newest if k[:3] == group), key=precision_order)
        entries = [newest[k] for k in keys]
        model, (par, ranks), device = group
        where = "one GPU" if ranks == 1 else f"{par}, {ranks} GPUs"
        out += [f"### {model}, {where}, {device}", "", *step_table(entries, label), *peer_table(entries, label), ""]
    out += ["Runs (each row's `run`):", ""]
    for r in shown:
        out.append(f"- **{labels[id(r)]}** {run_line(r, page_dir)}")
        out += [f"  - {note}" for note in r.notes if note.startswith("caveat: ")]
    return out + [""], shown


SECTIONS = [  # (heading, kinds shown: the newest run of each)
    ("FP8 linear fwd+bwd, one CUDA graph per fwd+bwd, cached weights (bench/linear.py)", ["linear_graph"]),
    ("FP8 quantizers (bench/quant.py)", ["quant"]),
    ("Attention kernels, causal and packed documents (bench/attention.py)", ["attention_1.5b", "attention_7b"]),
    ("Chunked LM head + cross entropy (bench/lm_loss.py)", ["lm_loss"]),
    ("Optimizers: step time and memory per parameter (bench/optim.py)", ["optim"]),
    ("Loss parity, FP8 recipes vs BF16 (bench/parity.py)", ["parity_seeds", "parity"]),
    ("Generation without vLLM: infir-eval's HF backend by mode (bench/generate.py)", ["gen_speed"]),
    ("Checkpoint stall: how long a step waits while a checkpoint is written (bench/save_stall.py)", ["save_stall_7b_tp2"]),
]


LONG_TABLE = 8  # rows: after a run's first table, a longer one is named on the page, not shown (its result file has it)
FIRST_TABLE = 8  # rows of a run's first table shown on the page; the rest are named (its result file has them)


def run_block(run: Run, page_dir: Path) -> list[str]:
    """A run as its report printed it: its notes, its tables (each under its caption; after the first, long
    ones only named), its figure if any."""
    out = [f"Run: {run_line(run, page_dir)}", ""]
    out += [line for note in run.notes for line in (note, "")]
    for i, t in enumerate(run.tables):
        if i and len(t["printed"]) > LONG_TABLE:
            out += [f"(also in the result file: {t['caption'] or 'a table'} of {len(t['printed'])} rows)", ""]
            continue
        if t["caption"]:
            out += [f"**{t['caption']}**", ""]
        rows = t["printed"][:FIRST_TABLE]
        out += table(t["columns"], rows) + [""]
        if len(rows) < len(t["printed"]):
            out += [f"({len(t['printed']) - len(rows)} more rows in the result file)", ""]
    png = run.folder / f"{run.kind}.png"
    if png.exists():
        out += [f"![{run.kind}]({os.path.relpath(png, page_dir)})", ""]
    return out


def newest_per_size(runs: list[Run]) -> list[Run]:
    """The newest of runs of one kind (oldest first), and before it each older one that measured a data-parallel
    size (its rows' DP column) no newer one did: a 2-GPU run does not hide the last 4-GPU one."""
    shown, sizes = [], set()
    for run in reversed(runs):
        dp = {row.get("DP") for t in run.tables for row in t["rows"]}
        if not shown or not dp <= sizes:
            shown.insert(0, run)
        sizes |= dp
    return shown


DP_KINDS = ["dp_scaling_a4", "dp_scaling_a1"]
DP_COLUMNS = ["model", "seq", "accum", "DP", "case", "tokens/s per GPU", "% of DP=1", "% of DP=1 beside",
              "exposed comm % of GPU time",
              "peak GiB", "DP=1 peak GiB", "peak vs predicted %", "param gather MiB per rank"]


def dp_row(printed: dict) -> list:
    """A DP table row's DP_COLUMNS: peaks as held (peak_memory.py), from tables that printed them so, else the
    allocated peaks of cases without CUDA graphs."""
    row = {c: printed.get(c, "") for c in DP_COLUMNS}
    for column in ("peak GiB", "DP=1 peak GiB"):
        held = printed.get(f"{column} held")
        graphed = graphs_by_default(str(printed.get("case", "")), "none")  # DP runs time no recomputation
        row[column] = held if held is not None else "" if graphed else printed.get(column, "")
    return list(row.values())


def dp_section(runs: list[Run], page_dir: Path) -> tuple[list[str], list[Run]]:
    """One table of the data-parallel runs: for each micro-batch count, the newest run of each DP size."""
    shown = [r for kind in DP_KINDS for r in newest_per_size([r for r in runs if r.kind == kind])]
    if not shown:
        return [], []
    labels = {id(r): chr(ord("a") + i) for i, r in enumerate(shown)}
    rows = [[*dp_row(dict(zip(r.tables[0]["columns"], p))), labels[id(r)]] for r in shown for p in r.tables[0]["printed"]]
    out = ["## Data-parallel scaling: tokens/s per GPU against one GPU (bench/dp_scaling.py)", "",
           *table([*DP_COLUMNS, "run"], rows), "", "Runs (each row's `run`):", ""]
    for r in shown:
        out.append(f"- **{labels[id(r)]}** {run_line(r, page_dir)}")
        out += [f"  - {note}" for note in r.notes if note.startswith("caveat: ")]
    return out + [""], shown


def kind_sections(runs: list[Run], page_dir: Path) -> tuple[list[str], list[Run]]:
    out, shown = [], []
    for heading, kinds in SECTIONS:
        newest = [[r for r in runs if r.kind == kind][-1] for kind in kinds if any(r.kind == kind for r in runs)]
        if newest:
            out += [f"## {heading}", ""]
            for run in newest:
                out += run_block(run, page_dir)
            shown += newest
    return out, shown


SCALING_TABLES = {  # kind: (a column that names its table, the columns shown)
    "scaling": ("efficiency", ["model", "seq", "replica", "precision", "GPUs", "tokens a step", "step_ms", "tokens/s per GPU",
                               "efficiency", "efficiency, DP not overlapped", "step_ms, FP8 param gather",
                               "efficiency, FP8 param gather"]),
    "scaling_validate": ("error_%", ["model", "seq", "layout", "precision", "GPUs", "device", "measured_ms", "predicted_ms",
                                     "error_%", "inputs on its device"]),
}
SCALING_NOTES = ("assumed:", "batch:", "efficiency =", "FP8 param gather", "prediction error:")  # the lines a short table needs beside it


def bandwidth_block(run: Run, page_dir: Path) -> list[str]:
    """A bandwidth run as one row per collective and group size, its bus bandwidth at every other size."""
    busbw = {(r["op"], r["ranks"], r["size_MiB"]): r["busbw_GB/s"] for r in run.rows("busbw_GB/s")}
    sizes = sorted({mib for _, _, mib in busbw})[::-2][::-1]  # the largest, and every other one below it
    groups = sorted({(op, ranks) for op, ranks, _ in busbw}, key=lambda k: (k[1], k[0]))
    table_rows = [[op, ranks, *(busbw.get((op, ranks, mib)) for mib in sizes)] for op, ranks in groups]
    return [f"Run: {run_line(run, page_dir)}", "", "**Bus bandwidth (GB/s) by message size**", "",
            *table(["op", "ranks", *(f"{mib} MiB" for mib in sizes)], table_rows), ""]


def short_block(run: Run, page_dir: Path) -> list[str]:
    """A projection or validation run: the notes that state its assumptions and, for a projection, its rows at
    the largest GPU count (the figure has every count; the validation's rows are in its result file)."""
    key, columns = SCALING_TABLES[run.kind]
    out = [f"Run: {run_line(run, page_dir)}", ""]
    out += [line for note in run.notes if note.startswith(SCALING_NOTES) for line in (note, "")]
    if run.kind == "scaling":
        rows = run.rows(key)
        most = max((r["GPUs"] for r in rows if is_number(r.get("GPUs"))), default=None)
        out += table(columns, [[r.get(c) for c in columns] for r in rows if r.get("GPUs") == most]) + [""]
    png = run.folder / f"{run.kind}.png"
    if png.exists():
        out += [f"![{run.kind}]({os.path.relpath(png, page_dir)})", ""]
    return out


def scaling_section(runs: list[Run], page_dir: Path) -> tuple[list[str], list[Run]]:
    """The newest bandwidth run of each GPU count, projection and validation (bench/scaling.py). A bandwidth run
    whose group sizes a newer one on the same device also measured is left to its result file (a 4-GPU run
    measures groups of 2 as well)."""
    newest = {r.kind: r for r in runs if r.kind in SCALING_TABLES or r.kind.startswith("scaling_bw")}  # oldest first
    if not newest:
        return [], []

    def covered(run: Run) -> bool:
        ranks = {r["ranks"] for r in run.rows("busbw_GB/s")}
        return any(other is not run and other.kind.startswith("scaling_bw") and other.env.get("device") == run.env.get("device")
                   and other.env.get("date", "") > run.env.get("date", "") and ranks <= {r["ranks"] for r in other.rows("busbw_GB/s")}
                   for other in newest.values())

    newest = {k: r for k, r in newest.items() if not (k.startswith("scaling_bw") and covered(r))}
    out = ["## Scaling model (bench/scaling.py)", "",
           "Collective bandwidth measured here; the step time projected to 8-512 GPUs from measured steps, "
           "the measured bandwidth and the communication volume of each layout; and the model's prediction of "
           "every measured step. The full tables are in the result files.", ""]
    for kind in sorted(newest, key=lambda k: (not k.startswith("scaling_bw"), k == "scaling_validate", k)):
        block = bandwidth_block if kind.startswith("scaling_bw") else short_block
        out += block(newest[kind], page_dir)
    return out, list(newest.values())


def hardware_section(shown: list[Run]) -> list[str]:
    keys = ("device", "torch", "cuda", "triton", "python")
    seen: dict[tuple, list[str]] = {}
    for run in shown:
        seen.setdefault(tuple(run.env.get(k) for k in keys), []).append(run.env.get("date", "?")[:10])
    rows = [[*k, ", ".join(sorted(set(dates)))] for k, dates in sorted(seen.items(), key=lambda kv: str(kv[0]))]
    columns = ["device", "torch", "CUDA", "triton", "python", "run dates"]
    return ["## Hardware and versions", "", *table(columns, rows), ""]


def render(results: Path, page: Path) -> str:
    runs = load_runs(results)
    page_dir = page.resolve().parent
    steps, step_runs = step_section(runs, page_dir)
    kinds, kind_runs = kind_sections(runs, page_dir)
    dp, dp_runs = dp_section(runs, page_dir)
    scaling, scaling_runs = scaling_section(runs, page_dir)
    head = ["# Benchmarks", "",
            "Generated by `python3 bench/report.py` from the result files under `bench/results/` (one folder per "
            "run date and commit; `bash bench/gpu_suite.sh` writes a new one); do not edit by hand. Every figure is "
            "copied from a file a bench script wrote; each row names the run, its commit and the command that "
            "reproduces it.", ""]
    method = ["## Method", "", *METHOD.split("\n"), ""]
    lines = head + hardware_section(step_runs + kind_runs + dp_runs + scaling_runs) + method + steps + kinds + dp + scaling
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--page", type=Path, default=REPO / "BENCHMARKS.md")
    p.add_argument("--check", action="store_true", help="exit 1 if the page differs from what the results generate")
    args = p.parse_args()
    text = render(args.results, args.page)
    if args.check:
        if not args.page.exists() or args.page.read_text() != text:
            sys.exit(f"{args.page} is not what the results under {args.results} generate: run python3 bench/report.py")
        return
    args.page.write_text(text)
    print(f"wrote {args.page} ({len(text.splitlines())} lines) from {args.results}")


if __name__ == "__main__":
    main()
