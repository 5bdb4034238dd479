"""Data-parallel scaling from bench/step.py's result files: each case's tokens/s per GPU at DP=N against
the same case on one GPU (DP=1), with the exposed communication of its profiled step (bench/step.py
--profile: the middle of three).

    python3 bench/step.py ... --out OUT/step_dp1.md                                    # one process
    torchrun --nproc_per_node 2 bench/step.py ... --out OUT/step_dp2.md                # the same cases
    python3 bench/dp_scaling.py --one OUT/step_dp1.json --many OUT/step_dp2.json --out OUT/dp_scaling.md
    # and, beside it, the same one-GPU cases on every GPU at once (bench/step.py --beside, no communication):
    python3 bench/dp_scaling.py ... --beside OUT/beside_dp1_gpu*.json

With --beside, each case's tokens/s per GPU is also given against the one-GPU runs timed at once on all the
host's GPUs: what N busy GPUs of one host give (each at its power cap, sharing the host's CPUs and memory),
so that what remains below it is what data parallelism's communication costs. The slowest of them is the
baseline: a data-parallel step goes at its slowest rank's pace, and GPUs of one host differ by a few percent.

Memory: each case's held peak per GPU beside the one ZeRO-1 predicts, the DP=1 case's less the share of its
optimizer states (measured: the bytes of its states on the GPU) that the other ranks hold instead.

bench/step.py keeps `--accum` micro-batches per GPU at every DP size (the global batch grows with DP), so
per-GPU tokens/s compare directly. A case at DP=N may carry optimizer overrides the DP=1 run does not
(`+optimizer.distributed=false`: replicated states); it is compared with the DP=1 case that has the same
overrides apart from `optimizer.*`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from _common import base_parser, emit, markdown_table
from peak_memory import held_peak_GiB


def _table(result: dict, first_column: str) -> list[dict]:
    for table in result["tables"]:
        if table["columns"] and table["columns"][0] == first_column:
            return table["rows"]
    return []


def _ranks(result: dict) -> int:
    for note in result.get("notes", []):
        if m := re.search(r"(\d+) rank\(s\)", note):
            return int(m.group(1))
    m = re.search(r"nproc_per_node[ =](\d+)", result["env"].get("command", ""))
    return int(m.group(1)) if m else 1


def _key(row: dict) -> tuple:
    """A case without its optimizer.* overrides: what its DP=1 counterpart shares."""
    name, _, extra = row["precision"].partition("+")
    rest = sorted(o for o in extra.split(",") if o and not o.startswith("optimizer."))
    return row["model"], row["seq"], row["recompute"], row["accum"], name, tuple(rest)


def _profiled(result: dict, row: dict, column: str) -> float | None:
    """The case's `column` in the profile table (% of GPU time), 0 where the profile has none."""
    case = f"{row['model']} {row['precision']} s{row['seq']} {row['recompute']}"
    for prof in _table(result, "case"):
        if prof["case"] == case:
            value = prof.get(column)
            return float(str(value).rstrip("%")) if value not in (None, "") else 0.0
    return None


def _measured(result: dict) -> dict:
    return {_key(r): r for r in _table(result, "model") if isinstance(r.get("step_ms"), (int, float))}


def scaling_rows(one: dict, many: list[dict], beside: list[dict] = ()) -> list[dict]:
    """One row per DP>1 case that has a DP=1 counterpart with a measured step; where the one-GPU cases were
    also timed on every GPU at once (`beside`), against the slowest of them too."""
    base = _measured(one)
    together = [_measured(b) for b in beside]
    rows = []
    for result in many:
        dp = _ranks(result)
        for r in _table(result, "model"):
            b = base.get(_key(r))
            if b is None or not isinstance(r.get("step_ms"), (int, float)):
                continue
            per_gpu = r["tokens/s"] / dp
            rows.append({"model": r["model"], "seq": r["seq"], "case": r["precision"], "accum": r["accum"], "DP": dp,
                         "tokens/s per GPU": round(per_gpu), "DP=1 tokens/s": b["tokens/s"],
                         "% of DP=1": 100 * per_gpu / b["tokens/s"],
                         **({"% of DP=1 beside": 100 * per_gpu / _slowest_tokens(together, _key(r))} if together else {}),
                         "exposed comm % of GPU time": _profiled(result, r, "exposed communication"),
                         "peak GiB held": held_peak_GiB(r), "DP=1 peak GiB held": held_peak_GiB(b),
                         **predicted_peak(r, b, dp),
                         "param gather MiB per rank": r.get("param_gather_MiB"),
                         "all-gather % of GPU time": _profiled(result, r, "all-gather")})
    return rows


def predicted_peak(row: dict, one: dict, dp: int) -> dict:
    """The held peak ZeRO-1 should leave at DP=`dp`: the DP=1 case's, less the (dp-1)/dp of its optimizer states
    that the other ranks hold instead (nothing less where the states stay replicated), and the measured peak's
    difference from it in percent. Empty where either run did not record its states."""
    if "optim_state_GiB" not in one or "sharded_states" not in row:
        return {}
    sharded = str(row["sharded_states"]) == "True"  # a result file's cells are as its report printed them
    shed = one["optim_state_GiB"] * (1 - 1 / dp) if sharded else 0.0
    predicted = held_peak_GiB(one) - shed
    return {"predicted peak GiB held": predicted,
            "peak vs predicted %": 100 * (held_peak_GiB(row) - predicted) / predicted}


def _slowest_tokens(results: list[dict], key: tuple) -> float:
    values = [m[key]["tokens/s"] for m in results if key in m]
    if len(values) != len(results):
        raise SystemExit(f"dp_scaling: case {key} was not timed in every --beside result ({len(values)} of {len(results)})")
    return min(values)


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--one", required=True, help="bench/step.py's result file of the one-GPU run")
    p.add_argument("--many", nargs="+", required=True, help="result files of the same cases under torchrun")
    p.add_argument("--beside", nargs="*", default=[],
                   help="result files of the one-GPU cases timed on every GPU at once (bench/step.py --beside)")
    args = p.parse_args()
    one = json.loads(Path(args.one).read_text())
    many = [json.loads(Path(f).read_text()) for f in args.many]
    beside = [json.loads(Path(f).read_text()) for f in args.beside]
    rows = scaling_rows(one, many, beside)
    if not rows:
        raise SystemExit(f"dp_scaling: no case of {', '.join(args.many)} matches one of {args.one}; run the same "
                         "--cases (optimizer.* overrides aside) in both")
    devices = sorted({r["env"].get("device", "?") for r in [one, *many, *beside]})
    notes = [f"devices: {', '.join(devices)}; DP=1 command: `{one['env'].get('command', '')}`"]
    if beside:
        notes.append(f"% of DP=1 beside: against the slowest of {len(beside)} one-GPU runs timed at once, one per GPU "
                     f"(`{beside[0]['env'].get('command', '')}`)")
    emit("Data-parallel scaling, infir trainer (tokens/s per GPU vs one GPU, same cases)", [*notes, markdown_table(rows)],
         args.out)


if __name__ == "__main__":
    main()
