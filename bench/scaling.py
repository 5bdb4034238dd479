"""A scaling model: collective bandwidth measured here, step time projected to 8-512 GPUs, checked against steps measured.

    torchrun --nproc-per-node N bench/scaling.py measure --out R/scaling_bw_Ngpu.md   # all-gather, reduce-scatter,
        # all-reduce bus bandwidth (nccl-tests' convention), bf16, 1 MiB .. 1 GiB, over 2, 4, .. N of the GPUs
    python bench/scaling.py project --out R/scaling.md      # 1.5B and 7B at 8k and 32k on 8, 64, 512 GPUs (+ R/scaling.png)
    python bench/scaling.py validate --out R/scaling_validate.md   # the model against every measured step

`project` and `validate` read result files only (bench/results/*/: bench/step.py's steps, this script's
bandwidth), so they run on any machine. The model itself is bench/scaling_model.py: compute from a measured
step (one GPU's where there is one; else a step of several GPUs with its communication taken out: 7B with
AdamW does not fit one 80 GB GPU), priced by its counts, its attention at the FLOP rate the profiled
steps show at the length priced (causal attention kernels run faster on longer sequences); communication
from infir.train.comm_volume's volumes over the measured bus bandwidth, hierarchical across nodes. Each case's data parallelism is the
trainer's for its optimizer overrides: by default ZeRO-1, overlapped, wherever DP x CP > 1; with
`+optimizer.distributed=false,optimizer.overlap_grad_reduce=false`, replicated states and one all-reduce
after the backward. What overlapped collectives take from the compute beside them is measured: a
data-parallel step against its one-GPU twin, separately for steps of one micro-batch per rank and of several
(`validate` prices each step with the contention of the others of its kind). A step's
micro-batches per rank come from its own tokens/s and step time, whatever its `accum` meant when it ran.
The projection keeps InfiR2's CPT batch of 4M tokens a step at every GPU count (`--global-tokens`;
`--accum` grows it with the GPUs instead), rounded up to whole micro-batches per DP rank where it does not
split over them (at least one a rank: at 512 GPUs a 32k-row batch of 128 rows grows to one row per rank).
`validate` prices each measured step as it ran, from another measured step.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, markdown_table, slowest_rank_ms  # noqa: E402
from report import (  # noqa: E402
    Run, is_number, load_run, load_runs, measured_before_a_fix, parallel, parallel_conf, ran_tp_overlap, world_size,
)
from scaling_model import (  # noqa: E402
    BusBandwidth, Case, ComputeRates, Network, Overlap, attention_flops, predict, profiled_compute_ms, weight_quant_elems,
)

from infir.model.qwen import get_size  # noqa: E402
from infir.train.comm_volume import (  # noqa: E402
    OPS, DataParallel, Layout, dp_collectives, rank_params, ring_factor, trainer_data_parallel,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LAYOUTS = [  # MODEL:SEQ:LAYOUT:RECOMPUTE, InfiR2's CPT layouts (1.5B at TP=2, 7B at TP=4 for 32k) and neighbours
    "qwen2.5-1.5b:8192:tp1:none", "qwen2.5-1.5b:32768:tp2:full",
    "qwen2.5-7b:8192:tp2:full", "qwen2.5-7b:32768:tp4:full", "qwen2.5-7b:32768:tp2cp2:full",
]


ONE_GPU = (Network(BusBandwidth.flat(1.0)), "", True)  # network() of a device whose steps ran on one GPU only


def fail(message: str) -> None:
    sys.exit(f"bench/scaling.py: {message}")


# ----------------------------------------------------------------------------------------------- measure
def group_sizes(world: int) -> list[int]:
    """The group sizes measured on `world` GPUs: powers of two from 2, and world itself."""
    return sorted({2 ** k for k in range(1, int(math.log2(world)) + 1)} | {world})


def bandwidth_row(op: str, ranks: int, nbytes: int, seconds: float) -> dict:
    algbw = nbytes / seconds / 1e9
    return {"op": op, "ranks": ranks, "size_MiB": round(nbytes / 2**20), "time_us": seconds * 1e6,
            "algbw_GB/s": algbw, "busbw_GB/s": algbw * ring_factor(op, ranks)}


def time_collective(op: str, nbytes: int, group, ranks: int, warmup: int, iters: int) -> float:
    """Seconds per collective of nbytes (bf16, nccl-tests' size) over `group`: CUDA events around `iters`
    back-to-back calls after `warmup`, the slowest rank's mean."""
    import torch
    import torch.distributed as dist

    shard = torch.zeros(nbytes // 2 // ranks, dtype=torch.bfloat16, device="cuda")
    full = torch.zeros(shard.numel() * ranks, dtype=torch.bfloat16, device="cuda")  # a whole number of shards
    call = {"all_gather": lambda: dist.all_gather_into_tensor(full, shard, group=group),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full, group=group),
            "all_reduce": lambda: dist.all_reduce(full, group=group)}[op]
    return slowest_rank_ms(call, group, warmup, iters) / 1e3


def measure(args) -> None:
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2 or not torch.cuda.is_available():
        fail("measure needs two or more GPUs under torchrun: "
             "torchrun --nproc-per-node N bench/scaling.py measure --out FILE.md")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, rows = dist.get_rank(), []
    sizes = [2**20 * 2**k for k in range(int(math.log2(args.min_mib)), int(math.log2(args.max_mib)) + 1)]
    for n in group_sizes(world):
        group = dist.new_group(list(range(n)))  # every rank takes part in making each group
        if rank < n:
            for op in OPS:
                rows += [bandwidth_row(op, n, b, time_collective(op, b, group, n, args.warmup, args.iters)) for b in sizes]
        dist.barrier()
    if rank == 0:
        emit("Collective bus bandwidth, NCCL through torch.distributed (bench/scaling.py measure)",
             [f"{world} GPUs; bf16 buffers; {args.warmup} warm-up and {args.iters} timed calls a size (CUDA events, "
              "the slowest rank's mean); busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and "
              "reduce-scatter (nccl-tests' convention, size = the whole buffer)",
              markdown_table(rows)], args.out)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------- result files
DP_FIELDS = ("distributed", "overlap_grad_reduce", "bucket_size", "grad_reduce_dtype", "fp8_param_gather")  # optimizer.* that shape DP
DP_ONLY = ("optimizer.distributed=", "optimizer.overlap_grad_reduce=", "optimizer.bucket_size=")  # no GPU's compute


@dataclass(frozen=True)
class Measured:
    """One row of a bench/step.py result: the step as it ran."""

    run: Run
    row: dict
    layout: Layout
    case: str  # what a GPU computes: the precision and its overrides other than parallel.* and DP-only ones
    shares: dict | None  # its profile's shares of GPU time, by kernel class

    @property
    def device(self) -> str:
        return self.run.env.get("device", "?")

    @property
    def tp_overlap(self) -> bool:
        """Whether its TP collectives were split around their GEMMs (report.ran_tp_overlap)."""
        return ran_tp_overlap(self.row)

    @property
    def label(self) -> str:
        return f"{self.row['model']} s{self.row['seq']} {self.row['precision']} ({self.run.folder.name}/{self.run.kind})"

    @property
    def micro_batches(self) -> int | None:
        """Micro-batches per data-parallel rank a step, from the row's own figures: tokens a step (tokens/s x step
        time) over the rows' tokens and the DP size. Its `accum` once counted the step's micro-batches of all
        ranks, now those of each; None where the figures give no whole number."""
        r = self.row
        if not all(is_number(r.get(k)) for k in ("tokens/s", "step_ms", "mbs", "seq")):
            return None
        per_rank = r["tokens/s"] * r["step_ms"] / 1e3 / (r["mbs"] * r["seq"] * self.layout.dp)
        n = round(per_rank)
        return n if n >= 1 and abs(per_rank - n) <= 0.05 * per_rank else None  # step_ms has 3 significant digits

    @property
    def dp(self) -> DataParallel:
        """Its data parallelism, as the trainer ran it: its optimizer overrides on its layout. Steps measured
        since the trainer gathers FP8 weights as FP8 (after one all-reduce of their block amaxes) carry the
        bytes they gathered (param_gather_MiB); older ones gathered the parameters."""
        precision = self.row["precision"]
        oc, fp8 = optimizer_config(precision), recipe_of(precision).fp8
        plain = trainer_data_parallel(oc, self.layout)
        narrow = [trainer_data_parallel(oc, self.layout, bf16_params=True, fp8_linears=fp8)] if bf16_gather(precision) else []
        if block_fp8(precision):
            narrow += [trainer_data_parallel(oc, self.layout, "amax", bf16_params=bf16) for bf16 in (False, True)]
        if plain.mode != "zero1" or not narrow or not is_number(self.row.get("param_gather_MiB")):
            return plain
        # the bytes it gathered say which gather ran (the trainer's choice was not the same at every commit)
        size, layout = get_size(self.row["model"]), self.layout
        sent = self.row["param_gather_MiB"] * 2**20 * layout.grad_ranks

        def miss(dp: DataParallel) -> float:
            return abs(sum(c.bytes * c.calls for c in dp_collectives(size, layout, dp) if c.name == "parameters") - sent)

        return min([plain, *narrow], key=miss)

    def priced(self) -> Case:
        r = self.row
        return Case(get_size(r["model"]), r["seq"], r["mbs"], self.micro_batches, self.layout, fp8_sp_gather(self.case),
                    weight_passes(r["precision"], self.layout.recompute, self.micro_batches))

    def rates(self, net: Network, contention: float) -> ComputeRates:
        """Its compute rates, from its time less its communication: the model's own data-parallel cost (`net`,
        `contention`) of a DP step, whose profile cannot tell what an overlapped collective took from the compute
        beside it; the profiled collectives of any other (TP/CP ones, which the step waits on; where DP runs
        beside TP/CP, the profile cannot tell them apart and takes all of them out)."""
        r, lay, size = self.row, self.layout, get_size(self.row["model"])
        owned = rank_params(size, lay.tp) / (lay.grad_ranks if self.dp.mode == "zero1" else 1)

        weights = weight_quant_elems(self.priced(), self.dp)

        def rates_at(ms: float) -> ComputeRates:
            return ComputeRates.from_step(size, r["seq"], self.micro_batches * lay.dp * r["mbs"] * r["seq"], ms, lay,
                                          self.shares, owned, self.label, weights)

        if lay.grad_ranks == 1 or lay.tp * lay.cp > 1:
            return rates_at(profiled_compute_ms(r["step_ms"], self.shares) if self.shares else r["step_ms"])
        rates = rates_at(r["step_ms"])
        for _ in range(3):  # its overlap windows depend on the compute the DP cost leaves: a few rounds settle it
            cost = predict(self.priced(), rates, net, self.dp, Overlap(dp_contention=contention))["dp_cost_ms"]
            rates = rates_at(r["step_ms"] - cost)
        return rates


def overrides(precision: str) -> list[str]:
    return [o for o in precision.partition("+")[2].split(",") if o]


def weight_passes(precision: str, recompute: str, micro_batches: int) -> float:
    """How many times a GPU quantizes its FP8 linear weights in a step, as the trainer runs the case: once where
    it keeps them for the step, at every forward (and its recomputation) where it makes them per forward
    (model.fp8_weight_cache; infir.train.loop.transient_fp8_weights); 0 without FP8 weights."""
    import yaml

    from infir.train.loop import transient_fp8_weights

    recipe = recipe_of(precision)
    if not recipe.fp8:
        return 0.0
    keys = dict(o.lstrip("+").partition("=")[::2] for o in overrides(precision))
    choice = yaml.safe_load(keys.get("model.fp8_weight_cache", "auto"))
    if not transient_fp8_weights(choice, recipe, recompute, param_gather=False):
        return 1.0
    return micro_batches * (2.0 if recompute == "full" else 1.0)


def case_of(precision: str) -> str:
    """What a GPU computes: the precision with its overrides other than parallel.* (which the layout holds),
    those that only choose how data parallelism communicates, and one naming the default optimizer."""
    rest = [o for o in overrides(precision)
            if not o.startswith(("parallel.", *DP_ONLY)) and o.lstrip("+") != f"optimizer={default_optimizer()}"]
    return "+".join([precision.partition("+")[0], ",".join(rest)]) if rest else precision.partition("+")[0]


@functools.lru_cache(maxsize=None)
def default_optimizer() -> str:
    """conf/config.yaml's optimizer: the trainer's where a case names none."""
    import yaml

    defaults = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())["defaults"]
    return next(d["optimizer"] for d in defaults if isinstance(d, dict) and "optimizer" in d)


@functools.lru_cache(maxsize=None)
def optimizer_config(precision: str):
    """The trainer's optimizer config for a case: its `optimizer=` (else the default) with its `optimizer.*`
    overrides that shape data parallelism, checked as the trainer checks them."""
    import yaml

    from infir.train.config import ConfigError
    from infir.train.schema import OptimizerConfig

    name, keys = default_optimizer(), {}
    for o in overrides(precision):
        key, _, value = o.lstrip("+").partition("=")
        if key == "optimizer":
            name = value
        elif key.startswith("optimizer.") and key.split(".", 1)[1] in DP_FIELDS:
            keys[key.split(".", 1)[1]] = yaml.safe_load(value)
    try:
        return OptimizerConfig(name=name, **keys)
    except ConfigError as e:
        fail(f"case {precision!r}: {e}")


def run_layout(run: Run, row: dict) -> Layout:
    """The layout a bench/step.py row ran: its conf/parallel, that case's parallel.* overrides, the ranks."""
    import yaml

    conf = dict(parallel_conf(parallel(run)))
    for o in overrides(row["precision"]):
        key, _, value = o.partition("=")
        if key.startswith("parallel."):
            conf[key.split(".", 1)[1]] = yaml.safe_load(value)
    tp, cp = int(conf["tp"]), int(conf.get("cp", 1))
    return Layout(tp=tp, cp=cp, dp=max(1, world_size(run) // (tp * cp)), sequence_parallel=bool(conf["sequence_parallel"]),
                  recompute=row["recompute"])


def profile_shares(run: Run, row: dict) -> dict | None:
    """Its profile's shares (fractions) of GPU time by kernel class, where the run profiled the row."""
    name = f"{row['model']} {row['precision']} s{row['seq']} {row['recompute']}"
    prof = next((r for r in run.rows("case") if r.get("case") == name), None)
    if prof is None:
        return None
    return {k: float(str(v).rstrip("%")) / 100 for k, v in prof.items() if k != "case" and v not in (None, "")}


def step_records(runs: list[Run]) -> list[Measured]:
    """Every timed row of infir's trainer in bench/step.py results, the newest of each configuration, less the
    rows a case's caveat says were measured before a fix."""
    from infir.fp8 import RECIPES

    newest: dict[tuple, Measured] = {}
    for run in runs:
        if not run.kind.startswith("step"):
            continue
        for row in run.rows("step_ms"):
            if not is_number(row.get("step_ms")) or row.get("precision", "").partition("+")[0] not in RECIPES \
                    or measured_before_a_fix(run, row):
                continue
            m = Measured(run, row, run_layout(run, row), case_of(row["precision"]), profile_shares(run, row))
            key = (row["model"], row["seq"], row.get("mbs"), row.get("accum"), row["precision"], m.layout, m.device)
            newest[key] = m
    return list(newest.values())


def compute_path(layout: Layout) -> tuple[bool, bool]:
    """What changes a GPU's work beyond its share of FLOPs: context parallelism runs attention through the
    document kernels, and tensor parallelism without SP repeats the norms and residuals on every rank."""
    return layout.cp > 1, layout.tp > 1 and not layout.sequence_parallel


def pick_source(sources: list[Measured], model: str, seq: int, layout: Layout, case: str, device: str,
                exclude_own: bool = False) -> Measured | None:
    """The measured step to take compute from: one of the same recompute, case (what a GPU computes) and compute
    path, of whole micro-batches, profiled where it ran on several GPUs (to take its communication out), and
    with exclude_own not this model, length and layout; then, in order, on `device` (a fragment of its name),
    of the same model (else the nearest in size), for FP8 cases one whose profile times the weight quantizers
    apart (older profiles count them with the per-token quantizers: priced at another length or number of
    micro-batches, work done per weight would scale with tokens), of the nearest length, without data
    parallelism, on one GPU, with the trainer's default data parallelism (no DP-only overrides: what project
    prices, and what the measured contention describes), profiled, newest. Never a step with its TP collectives
    split around the GEMMs: their transfers run on copy engines beside the compute, so its profile cannot take
    out the part the step waited on. Another model's step, priced by its
    counts, misses most (see validate), so the model comes right after the device."""
    pool = [s for s in sources if s.layout.recompute == layout.recompute and s.case == case and s.micro_batches
            and (s.shares or s.layout.gpus == 1) and compute_path(s.layout) == compute_path(layout)
            and not s.tp_overlap
            and not (exclude_own and (s.row["model"], s.row["seq"], s.layout) == (model, seq, layout))]
    pool.sort(key=lambda s: s.run.env.get("date", ""), reverse=True)  # ties go to the newest
    params = get_size(model).num_params()
    return min(pool, key=lambda s: (device not in s.device, abs(math.log(get_size(s.row["model"]).num_params() / params)),
                                    weight_quant_in_token_work(s),
                                    abs(math.log(s.row["seq"] / seq)), s.layout.grad_ranks > 1, s.layout.gpus > 1,
                                    any(o.startswith(DP_ONLY) for o in overrides(s.row["precision"])),
                                    s.shares is None), default=None)


def weight_quant_in_token_work(s: Measured) -> bool:
    """An FP8 step with no profile, or one with no class of its own for the weight quantizers (bench/step.py's
    classify): its weight quantization would be priced with the work that scales with tokens."""
    return recipe_of(s.row["precision"]).fp8 and "weight quantize" not in (s.shares or {})


def contention_pairs(records: list[Measured], nets: dict) -> list[tuple[Measured, Measured, float]]:
    """Each data-parallel step that overlapped its communication (one GPU a replica) with its one-GPU twin (the
    same model, length, rows, case and recompute on the same device), and the contention it shows: its time
    beyond the model's with the overlap free, over its overlapped communication's time at intra-node bandwidth."""
    pairs = []
    for m in records:
        if not (m.layout.grad_ranks > 1 and m.layout.tp * m.layout.cp == 1 and m.dp.overlap and m.micro_batches
                and m.device in nets):
            continue
        twin = next((s for s in records if s.layout.gpus == 1 and s.device == m.device and s.case == m.case
                     and s.micro_batches and all(s.row[k] == m.row[k] for k in ("model", "seq", "mbs", "recompute"))), None)
        if twin is None:
            continue
        net = nets[m.device][0]
        free = predict(m.priced(), twin.rates(net, 0.0), net, m.dp, Overlap())
        if free["dp_hidden_ms"] > 0:
            pairs.append((m, twin, max(0.0, (m.row["step_ms"] - free["step_ms"]) / free["dp_hidden_ms"])))
    return pairs


RECOMPUTED_ATTENTION = 4.5 / 3.5  # full and selective recomputation run attention's forward (1 of fwd 1 + bwd 2.5) twice


def attention_rates(records: list[Measured]) -> list[tuple[Measured, float]]:
    """Each profiled step's attention kernels' FLOP rate per GPU (their profile share of its compute, over the
    attention FLOPs its tokens did, a recomputed forward included); context-parallel steps, whose attention
    runs other kernels, and steps on other data (packed documents: less attention than their length's causal
    FLOPs) left out."""
    out = []
    for m in records:
        r, lay = m.row, m.layout
        if not (m.shares and m.shares.get("attention") and m.micro_batches and lay.cp == 1) \
                or any(o.startswith("data.") for o in overrides(r["precision"])):
            continue
        compute_s = profiled_compute_ms(r["step_ms"], m.shares) / 1e3
        attention_s = compute_s * m.shares["attention"] / (1.0 - m.shares.get("communication", 0.0)) * lay.gpus
        flops = m.micro_batches * r["mbs"] * r["seq"] * lay.dp * attention_flops(get_size(r["model"]), r["seq"])
        out.append((m, flops * (1.0 if lay.recompute == "none" else RECOMPUTED_ATTENTION) / attention_s))
    return out


def attention_rate_at(rates: list[tuple[Measured, float]], seq: int, device: str, leave_out: Measured | None = None):
    """The attention kernels' FLOP rate at `seq` on `device` (else on any): the mean of the steps of that length,
    else interpolated in log length between the nearest lengths measured (the nearest one beyond them); None
    where there is none. Causal attention kernels run faster on longer sequences (more work per tile row)."""
    pool = [(m, f) for m, f in rates if m is not leave_out]
    pool = [(m, f) for m, f in pool if device in m.device] or pool
    if not pool:
        return None
    by_seq: dict[int, list[float]] = {}
    for m, f in pool:
        by_seq.setdefault(m.row["seq"], []).append(f)
    mean = {s: sum(v) / len(v) for s, v in by_seq.items()}
    below, above = [s for s in mean if s <= seq], [s for s in mean if s >= seq]
    if not below or not above:
        return mean[max(below) if below else min(above)]
    lo, hi = max(below), min(above)
    if lo == hi:
        return mean[lo]
    t = math.log(seq / lo) / math.log(hi / lo)
    return mean[lo] + t * (mean[hi] - mean[lo])


def attention_line(rates: list[tuple[Measured, float]]) -> str:
    """What attention_rate_at reads: the mean attention FLOP rate per GPU by device and length."""
    by: dict[tuple[str, int], list[float]] = {}
    for m, f in rates:
        by.setdefault((m.device, m.row["seq"]), []).append(f)
    return "attention priced by length, its kernels' FLOP rate per GPU in the profiled steps (a recomputed forward " \
        "counted): " + "; ".join(f"{d} at {s}: {sum(v) / len(v) / 1e12:.0f} TFLOP/s ({len(v)} steps)"
                                 for (d, s), v in sorted(by.items()))


def at_length(rates: ComputeRates, src: Measured, seq: int, device: str, attention: list,
              leave_out: Measured | None = None) -> ComputeRates:
    """`src`'s compute rates with its attention priced at `seq`: scaled by the measured attention FLOP rate at the
    source's length over that at `seq` (attention_rate_at)."""
    if src.row["seq"] == seq:
        return rates
    there = attention_rate_at(attention, src.row["seq"], src.device, leave_out)
    here = attention_rate_at(attention, seq, device, leave_out)
    if not there or not here:
        return rates
    return replace(rates, attention_s_per_flop=rates.attention_s_per_flop * there / here)


def tp_overlap_pairs(records: list[Measured], nets: dict) -> list[tuple[Measured, Measured, float]]:
    """Each tensor-parallel step with its collectives split around their GEMMs (parallel.tp_comm_overlap) with
    its twin without (the same model, length, rows, case and layout, in the same result file), and the share
    of the model's TP communication time the overlap took off the step: the twin's time less its own, over it."""
    pairs = []
    for m in records:
        if not (m.tp_overlap and m.layout.tp > 1 and m.micro_batches and m.device in nets):
            continue
        twin = next((s for s in records if s.run is m.run and not s.tp_overlap and s.case == m.case
                     and s.layout == m.layout and s.micro_batches == m.micro_batches
                     and all(s.row[k] == m.row[k] for k in ("model", "seq", "mbs"))), None)
        if twin is None:
            continue
        net = nets[m.device][0]
        comm = predict(m.priced(), twin.rates(net, 0.0), net, m.dp, Overlap())["tp_cp_comm_ms"]
        if comm > 0:
            pairs.append((m, twin, min(1.0, max(0.0, (twin.row["step_ms"] - m.row["step_ms"]) / comm))))
    return pairs


def pair_mean(pairs: list[tuple], device: str, leave_out: Measured | None, none: str, what: str,
              name=lambda m: m.row["precision"]) -> tuple[float, str]:
    """The mean figure of (step, twin, figure) pairs on `device` (else of all), leaving out those `leave_out` is
    part of, and a line saying where it comes from (`what` the pairs are); 0 and the line `none` where there is none."""
    pool = [(m, f) for m, twin, f in pairs if leave_out is not m and leave_out is not twin]
    here = [(m, f) for m, f in pool if device in m.device] or pool
    if not here:
        return 0.0, none
    steps = ", ".join(sorted(f"{name(m)} ({m.device})" for m, _ in here))
    return sum(f for _, f in here) / len(here), f"measured: {what}, {steps}"


def measured_tp_hidden(pairs: list[tuple], device: str, leave_out: Measured | None = None) -> tuple[float, str]:
    """The hidden share of TP communication (pair_mean; 0: all exposed)."""
    return pair_mean(pairs, device, leave_out,
                     "no step measured with and without parallel.tp_comm_overlap: all exposed",
                     "steps with the overlap against their twins without",
                     lambda m: f"{m.row['model']} {m.row['precision']}")


def measured_contention(pairs: list[tuple], device: str, leave_out: Measured | None = None,
                        micro_batches: int | None = None) -> tuple[float, str]:
    """The contention of overlapped data-parallel communication (pair_mean; 0: overlap free), from the steps of
    one micro-batch per rank a step where `micro_batches` is one, else from those of several, where any such was
    measured. The two differ: with one micro-batch the data-parallel hooks' host work, and the ranks' skew in it,
    lie on the GPU's timeline beside the collectives; behind queued micro-batches they do not."""
    what = "DP steps against their one-GPU twins"
    if micro_batches:
        alike = [p for p in pairs if (p[0].micro_batches > 1) == (micro_batches > 1)
                 and leave_out is not p[0] and leave_out is not p[1]]
        if alike:
            pairs, what = alike, f"DP steps of {'several micro-batches' if micro_batches > 1 else 'one micro-batch'} " \
                                 "per rank a step against their one-GPU twins"
    return pair_mean(pairs, device, leave_out,
                     "no data-parallel step measured beside its one-GPU twin: overlap assumed free", what)


def bandwidth_runs(runs: list[Run], paths: list[Path]) -> list[Run]:
    """The named bandwidth result files, or else every scaling_bw_* result under --results."""
    if paths:
        return [bandwidth_file(p) for p in paths]
    return [r for r in runs if r.kind.startswith("scaling_bw")]


def bandwidth_file(path: Path) -> Run:
    import json

    if not path.is_file():
        fail(f"--bandwidth {path}: no such file; give a result file of `bench/scaling.py measure` (NAME.json)")
    try:
        return load_run(path)
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as e:
        fail(f"--bandwidth {path}: not a result file ({type(e).__name__}); "
             "give the NAME.json `bench/scaling.py measure` wrote")


def bus_bandwidth(bw_runs: list[Run], device: str) -> tuple[BusBandwidth, str, bool] | None:
    """The measured curves of the newest bandwidth run per group size on `device` (else on any device),
    a line naming the runs, and whether they ran on `device`."""
    here = [r for r in bw_runs if device in r.env.get("device", "?")]
    on_device = here or bw_runs
    curves, used = {}, {}
    for run in on_device:  # oldest first: a newer run's group sizes replace an older one's
        points: dict[tuple, list] = {}
        for r in run.rows("busbw_GB/s"):
            points.setdefault((r["op"], r["ranks"]), []).append((r["size_MiB"] * 2**20, r["busbw_GB/s"]))
        curves.update(points)
        used.update({ranks: run for _, ranks in points})
    if not curves:
        return None
    names = sorted({f"{r.folder.name}/{r.kind} ({r.env.get('device', '?')})" for r in used.values()})
    return BusBandwidth(curves), "intra-node bus bandwidth measured in " + ", ".join(names), bool(here)


def network(args, runs: list[Run], device: str) -> tuple[Network, str, bool]:
    """The network a projection assumes: measured (or --intra-gbs) intra-node bus bandwidth, --inter-gbs
    per GPU across nodes; a line stating them, and whether the bandwidth was measured, on `device`."""
    if args.intra_gbs:
        bw, here = BusBandwidth.flat(args.intra_gbs), False
        line = f"intra-node bus bandwidth {args.intra_gbs:g} GB/s (--intra-gbs)"
    else:
        found = bus_bandwidth(bandwidth_runs(runs, args.bandwidth), device)
        if found is None:
            fail(f"no bandwidth result (scaling_bw_*.json) under {' '.join(map(str, args.results))}: run `torchrun "
                 "--nproc-per-node N bench/scaling.py measure --out FILE.md` on a GPU host, or give --bandwidth FILE.json "
                 "or --intra-gbs")
        bw, line, here = found
    line += f"; inter-node {args.inter_gbs:g} GB/s per GPU (--inter-gbs), {args.gpus_per_node} GPUs a node"
    return Network(bw, args.inter_gbs, args.gpus_per_node), line, here


def recipe_of(case: str):
    from infir.fp8 import get_recipe

    return get_recipe(case.partition("+")[0])


def fp8_sp_gather(case: str) -> bool:
    """Whether the recipe's SP gathers move FP8 (per-token input scales: infir.fp8.SequenceParallel)."""
    r = recipe_of(case)
    return r.fp8 and r.input.granularity == "token"


def device_networks(args, runs: list[Run], records: list[Measured]) -> dict:
    """network() for each device that ran a step on several GPUs."""
    return {d: network(args, runs, d) for d in sorted({m.device for m in records if m.layout.gpus > 1})}


def block_fp8(precision: str) -> bool:
    """Whether the recipe's weights are block-scaled FP8: those it can all-gather as E4M3 + block scales."""
    r = recipe_of(precision)
    return r.fp8 and r.weight.granularity == "block"


def bf16_gather(precision: str) -> bool:
    """Whether ZeRO-1 gathers FP32 parameters as BF16 under the recipe (the FP8 linears' weights apart), as the
    trainer decides it."""
    from infir.train.optimizer import bf16_param_gather

    return bf16_param_gather(recipe_of(precision), sharded=True)


def data_parallel(precision: str, layout: Layout, fp8_params: str = "off") -> DataParallel:
    """A projected case's data parallelism: the trainer's for its optimizer overrides, with the FP8 linears'
    weights gathered as `fp8_params` says (infir.train.comm_volume) where the recipe is block-scaled FP8, and
    the other FP32 parameters as BF16 where the trainer sends them so."""
    return trainer_data_parallel(optimizer_config(precision), layout, fp8_params if block_fp8(precision) else "off",
                                 bf16_params=bf16_gather(precision), fp8_linears=recipe_of(precision).fp8)


FP8_GATHERS = {"scales": "FP8 linear weights + block scales, the rest",
               "amax": "FP8 linear weights (block amaxes all-reduced), the rest"}


def describe(dp: DataParallel) -> str:
    grads = "FP32" if dp.grad_bytes == 4 else "BF16"
    if dp.mode == "zero1":
        params = {4: "FP32", 2: "BF16"}[dp.param_bytes]
        params = (f"{FP8_GATHERS[dp.fp8_params]} {params}" if dp.fp8_params != "off" else
                  f"{params} (FP8 linear weights {dp.fp8_weight_bytes * 8:.0f}-bit)" if dp.fp8_weight_bytes else params)
        kind = f"ZeRO-1 ({grads} gradients reduce-scattered, {params} parameters all-gathered"
    else:
        kind = f"DDP ({grads} gradients all-reduced"
    return kind + (", overlapped)" if dp.overlap else ", not overlapped)")


def fp8_gather_line(args) -> str:
    scales = ("with one FP32 scale per 128x128 block" if args.fp8_param_gather == "scales" else
              "after an all-reduce (MAX) of one FP32 amax per 128x128 block, from which every rank computes the scales")
    return ("FP8 param gather (columns so named; block-scaled FP8 recipes under ZeRO-1, optimizer.fp8_param_gather): "
            f"the parameter all-gather moves the QKV, proj, FC1 and FC2 weights as E4M3 bytes {scales} "
            "(--fp8-param-gather), and the embedding, LM head, norms and biases as the trainer sends them beside "
            "those: BF16 from FP32 masters under BF16 autocast, else the optimizer's parameter dtype")


def assumptions(args, net_line: str, dp_line: str, contention: str, tp_line: str) -> str:
    return (f"assumed: {net_line}; data parallel over the DP x CP ranks: {dp_line}; overlapped data-parallel "
            f"communication's contention with compute: {contention}; TP communication: {tp_line}; CP "
            "communication all exposed")


# ----------------------------------------------------------------------------------------------- project
def parse_spec(spec: str) -> tuple[str, int, int, int, str]:
    """MODEL:SEQ:tpN[cpM]:RECOMPUTE -> (model, seq, tp, cp, recompute)."""
    parts = spec.split(":")
    m = re.fullmatch(r"tp(\d+)(?:cp(\d+))?", parts[2]) if len(parts) == 4 else None
    if not m or not parts[1].isdigit():
        fail(f"--layouts {spec!r}: write MODEL:SEQ:tpN[cpM]:RECOMPUTE, e.g. qwen2.5-7b:32768:tp2cp2:full")
    try:
        get_size(parts[0])
    except KeyError as e:
        fail(f"--layouts {spec!r}: {e.args[0]}")
    return parts[0], int(parts[1]), int(m.group(1)), int(m.group(2) or 1), parts[3]


def project_row(args, spec: str, precision: str, gpus: int, src: Measured | None, rates: ComputeRates | None,
                net: Network, contention: Callable[[int], float], tp_hidden: float) -> dict:
    """One projected step; contention(micro-batches per rank): the data-parallel contention for its step."""
    model, seq, tp, cp, recompute = parse_spec(spec)
    row = {"model": model, "seq": seq, "replica": f"tp{tp}" + (f"cp{cp}" if cp > 1 else ""), "recompute": recompute,
           "precision": precision, "GPUs": gpus}
    if gpus % (tp * cp):
        return {**row, "step_ms": f"tp x cp = {tp * cp} does not divide {gpus} GPUs"}
    if src is None:
        return {**row, "step_ms": f"no measured step at recompute={recompute} {precision} on this compute path"}
    layout = Layout(tp=tp, cp=cp, dp=gpus // (tp * cp), recompute=recompute)
    micro = args.accum or micro_batches(args.global_tokens, args.mbs * seq, layout.dp)
    case = Case(get_size(model), seq, args.mbs, micro, layout, fp8_sp_gather(precision),
                weight_passes(precision, recompute, micro))
    dp = data_parallel(precision, layout)
    pred = predict(case, rates, net, dp, Overlap(tp_hidden, contention(micro)))
    if dp.overlap:  # beside it, the same step with its data-parallel communication in full view
        pred["efficiency, DP not overlapped"] = predict(case, rates, net, replace(dp, overlap=False),
                                                        Overlap(tp_hidden))["efficiency"]
    fp8 = data_parallel(precision, layout, args.fp8_param_gather)
    if fp8.fp8_params != "off":  # beside it, the same step with the FP8 linears' weights gathered in FP8
        gathered = predict(case, rates, net, fp8, Overlap(tp_hidden, contention(micro)))
        pred.update({f"{k}, FP8 param gather": gathered[k] for k in FP8_GATHER_COLUMNS})
    return {**row, "dp": layout.dp, "micro-batches": micro, "tokens a step": micro * args.mbs * seq * layout.dp, **pred,
            "source": src.label}


def micro_batches(tokens: int, per_micro_batch: int, dp: int) -> int:
    """Micro-batches per data-parallel rank of a step of about `tokens`: whole ones, at least one per rank. Where
    the tokens do not split evenly over the ranks the batch rounds up to the next whole micro-batch per rank (at 512
    GPUs, 4M tokens of 32k rows are 128 rows for 256 DP ranks: the batch grows to 256 rows)."""
    return max(1, math.ceil(tokens / (per_micro_batch * dp)))


FP8_GATHER_COLUMNS = ("step_ms", "dp_comm_ms", "efficiency")  # shown again with the FP8 parameter all-gather


def model_runs(args) -> list[Run]:
    """The result files the model reads, less those measured before a fix (report.measured_before_a_fix): a
    step that skipped work, or waited on a since-corrected fault, would price and judge the model wrongly."""
    return [r for r in load_runs(*args.results) if not measured_before_a_fix(r)]


def project(args) -> None:
    runs = model_runs(args)
    sources = step_records(runs)
    net, net_line, _ = network(args, runs, args.device)
    nets = device_networks(args, runs, sources)
    pairs = contention_pairs(sources, nets)

    def contention(micro: int) -> float:
        return args.dp_contention if args.dp_contention is not None \
            else measured_contention(pairs, args.device, micro_batches=micro)[0]

    if args.dp_contention is not None:
        contention_line = f"{args.dp_contention:.2f} (--dp-contention)"
    else:
        (one, one_line), (several, several_line) = (measured_contention(pairs, args.device, micro_batches=n)
                                                    for n in (1, 2))
        contention_line = (f"at one micro-batch per rank a step {one:.2f} ({one_line}), at several "
                           f"{several:.2f} ({several_line})")
    tp_hidden, tp_line = (args.tp_hidden, "--tp-hidden") if args.tp_hidden is not None \
        else measured_tp_hidden(tp_overlap_pairs(sources, nets), args.device)
    attention = attention_rates(sources)
    rows, dp_lines = [], {}
    for spec in args.layouts:
        model, seq, tp, cp, recompute = parse_spec(spec)
        for precision in args.precisions:
            dp_lines[precision] = describe(data_parallel(precision, Layout(tp=tp, cp=cp, dp=2)))
            src = pick_source(sources, model, seq, Layout(tp=tp, cp=cp, recompute=recompute), case_of(precision),
                              args.device)
            rates = at_length(src.rates(nets.get(src.device, ONE_GPU)[0], contention(src.micro_batches)), src, seq,
                              args.device, attention) if src else None
            rows += [project_row(args, spec, precision, gpus, src, rates, net, contention, tp_hidden)
                     for gpus in args.gpus]
    columns = ["model", "seq", "replica", "recompute", "precision", "GPUs", "dp", "micro-batches", "tokens a step",
               "step_ms", "compute_ms",
               "tp_cp_comm_ms", "dp_comm_ms", "dp_cost_ms", "tokens/s per GPU", "efficiency",
               "efficiency, DP not overlapped", *(f"{c}, FP8 param gather" for c in FP8_GATHER_COLUMNS), "source"]
    sections = [assumptions(args, net_line, "; ".join(f"{p}: {d}" for p, d in dp_lines.items()),
                            contention_line,
                            f"split around the GEMMs (parallel.tp_comm_overlap) at every TP size, {tp_hidden:.2f} of it "
                            f"off the step ({tp_line})"),
                ("batch: " + (f"{args.accum} micro-batches of {args.mbs} x seq tokens per data-parallel rank a step (the "
                              "global batch grows with the GPUs)" if args.accum else
                              f"{args.global_tokens} tokens a step at every GPU count, in micro-batches of {args.mbs} x seq; "
                              "where they do not split into whole micro-batches per data-parallel rank, the batch "
                              "rounds up to the next whole one per rank (at least one: column tokens a step)")
                 + "; compute from the measured step each row names (source), priced by its counts (bench/scaling_model.py), "
                 f"measured on {args.device} where there is one"),
                "efficiency = compute / step time: the share of the step not spent waiting on communication",
                fp8_gather_line(args),
                "Projected step:\n\n" + markdown_table(rows, columns)]
    emit("Scaling model: projected training step on 8 to 512 GPUs (bench/scaling.py project)", sections, args.out)
    if args.out:
        plot(rows, Path(args.out).with_suffix(".png"))


def plot(rows: list[dict], png: Path) -> None:
    """Projected efficiency vs GPU count, a line per model, length, replica layout and precision (dashed
    beside it: the same without data-parallel overlap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[str, list] = {}
    for r in rows:
        if is_number(r.get("efficiency")):
            label = f"{r['model'].removeprefix('qwen2.5-')} {r['seq'] // 1024}k {r['replica']} {r['precision']}"
            lines.setdefault(label, []).append((r["GPUs"], r["efficiency"], r.get("efficiency, DP not overlapped")))
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in sorted(lines.items()):
        gpus, eff, exposed = zip(*sorted(points))
        line, = ax.plot(gpus, eff, marker="o", label=label)
        if all(is_number(e) for e in exposed):
            ax.plot(gpus, exposed, marker="x", linestyle="--", color=line.get_color())
    gpus = sorted({r["GPUs"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.set_ylim(0, 1.02)
    ax.set(xlabel="GPUs", ylabel="efficiency (compute / step time)",
           title="Projected scaling efficiency (dashed: data-parallel communication not overlapped)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- validate
def validate_row(args, m: Measured, records: list[Measured], nets: dict, pairs: list[tuple],
                 tp_pairs: list[tuple]) -> dict | None:
    """The model's step time for a measured step, with compute from another measured step (not of this
    model, length and layout), and the contention and the TP overlap's hidden share measured without it;
    None where there is no source or the step's figures give no whole number of micro-batches per rank."""
    r, lay = m.row, m.layout
    src = pick_source(records, r["model"], r["seq"], lay, m.case, m.device, exclude_own=True)
    if src is None or not m.micro_batches:
        return None
    attention = attention_rates(records)

    def contention(step: Measured) -> float:  # the other DP steps' that accumulate as `step` does
        return args.dp_contention if args.dp_contention is not None \
            else measured_contention(pairs, step.device, m, step.micro_batches)[0]

    tp_hidden = 0.0
    if m.tp_overlap:
        tp_hidden = args.tp_hidden if args.tp_hidden is not None else measured_tp_hidden(tp_pairs, m.device, m)[0]
    net = nets.get(m.device, ONE_GPU)
    rates = at_length(src.rates(nets.get(src.device, ONE_GPU)[0], contention(src)), src, r["seq"], m.device,
                      attention, m)
    pred = predict(m.priced(), rates, net[0], m.dp, Overlap(tp_hidden, contention(m)))
    comm = (m.shares or {}).get("communication")
    return {"model": r["model"], "seq": r["seq"], "recompute": r["recompute"], "precision": r["precision"],
            "layout": lay.name, "GPUs": lay.gpus, "mbs x micro-batches": f"{r['mbs']}x{m.micro_batches}",
            "device": m.device, "measured_ms": r["step_ms"], "predicted_ms": pred["step_ms"],
            "error_%": 100 * (pred["step_ms"] - r["step_ms"]) / r["step_ms"], "compute_ms": pred["compute_ms"],
            "tp_cp_comm_ms": pred["tp_cp_comm_ms"], "profiled_comm_ms": comm * r["step_ms"] if comm else "",
            "data parallel": describe(m.dp) if lay.grad_ranks > 1 else "", "dp_comm_ms": pred["dp_comm_ms"],
            "dp_cost_ms": pred["dp_cost_ms"],
            "dp_contention": contention(m) if m.dp.overlap and lay.grad_ranks > 1 else "",
            "tp_hidden": tp_hidden if m.tp_overlap else "",
            "inputs on its device": "yes" if src.device == m.device and net[2] else "no", "source": src.label}


def error_summary(rows: list[dict]) -> str:
    def worst(sel):
        return f"max |error| {max(abs(r['error_%']) for r in sel):.2f}% over {len(sel)}" if sel else "none"

    multi = [r for r in rows if r["GPUs"] > 1]
    same = [r for r in multi if r["inputs on its device"] == "yes"]
    return (f"prediction error: 2+ GPUs with compute source and bandwidth measured on the step's own device: {worst(same)} "
            f"(target <= 10%); all 2+ GPU steps: {worst(multi)}; single-GPU steps (from another model, length or "
            f"layout): {worst([r for r in rows if r['GPUs'] == 1])}")


def validate(args) -> None:
    runs = model_runs(args)
    records = step_records(runs)
    if not records:
        fail(f"no bench/step.py result under {' '.join(map(str, args.results))}: nothing to validate against")
    nets = device_networks(args, runs, records)
    pairs, tp_pairs = contention_pairs(records, nets), tp_overlap_pairs(records, nets)
    rows, unpriced = [], []
    for m in records:
        row = validate_row(args, m, records, nets, pairs, tp_pairs)
        if row:
            rows.append(row)
        else:
            unpriced.append(f"{m.label} on {m.layout.name}")
    rows.sort(key=lambda r: (r["GPUs"], r["model"], r["seq"], r["precision"], r["device"]))
    contention = ("--dp-contention" if args.dp_contention is not None else
                  "each DP step's from the other DP steps measured beside their one-GPU twins, those of one micro-batch "
                  "per rank a step for such a step, else those of several (column dp_contention; "
                  + "; ".join(f"{m.label}: {c:.2f}" for m, _, c in pairs) + ")" if pairs else
                  "0, no data-parallel step measured beside its one-GPU twin: overlap assumed free")
    tp_line = ("--tp-hidden" if args.tp_hidden is not None else
               "each overlapped step's hidden share from the other steps measured with and without the overlap "
               "(column tp_hidden; " + "; ".join(f"{m.label}: {h:.2f}" for m, _, h in tp_pairs) + ")" if tp_pairs else
               "all exposed: no step measured with and without parallel.tp_comm_overlap")
    sections = [assumptions(args, "; ".join(f"{d}: {line}" for d, (_, line, _) in nets.items()) or "one GPU, no network",
                            "each step's own, as its optimizer overrides set the trainer (column data parallel)", contention,
                            tp_line),
                "each step is priced from another measured step (source: not of its model, length and layout; on its "
                "device where there is one, else `inputs on its device` says no), with its own layout and micro-batches "
                "per rank (from its tokens/s and step time); profiled_comm_ms: the step's collectives' kernel time in "
                "its profile (overlapped ones included)",
                error_summary(rows), attention_line(attention_rates(records)),
                "Predicted vs measured step:\n\n" + markdown_table(rows)]
    if unpriced:
        sections.append("not priced (no other usable measured step of the same recompute, case and compute path, or "
                        "figures that give no whole number of micro-batches per rank): " + "; ".join(sorted(unpriced)))
    emit("Scaling model vs measured steps (bench/scaling.py validate)", sections, args.out)


# ---------------------------------------------------------------------------------------------------- CLI
def model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", type=Path, nargs="+", default=[REPO / "bench" / "results"],
                   help="folders of result folders to read (bench/step.py steps, bandwidth)")
    p.add_argument("--bandwidth", type=Path, nargs="*", default=[],
                   help="bandwidth result files (measure's NAME.json; default: every scaling_bw_* under --results)")
    p.add_argument("--intra-gbs", type=float, help="a flat intra-node bus bandwidth (GB/s) instead of the measured curves")
    p.add_argument("--inter-gbs", type=float, default=50.0,
                   help="inter-node bandwidth per GPU, GB/s (default 50: 8 x 400 Gb/s InfiniBand per 8-GPU node)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--dp-contention", type=float,
                   help="what overlapped data-parallel communication costs the compute beside it, x its intra-node "
                        "time (default: measured, from data-parallel steps beside their one-GPU twins, those of one "
                        "micro-batch per rank a step for such a step, else those of several)")
    p.add_argument("--tp-hidden", type=float,
                   help="share of TP communication parallel.tp_comm_overlap takes off the step (default: measured, "
                        "from steps with and without it)")
    p.add_argument("--out", help="write the report (markdown) here, its result file beside it (NAME.json)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="bus bandwidth of NCCL collectives (under torchrun, GPUs)")
    m.add_argument("--min-mib", type=int, default=1)
    m.add_argument("--max-mib", type=int, default=1024)
    m.add_argument("--warmup", type=int, default=5)
    m.add_argument("--iters", type=int, default=20)
    m.add_argument("--out", help="write the report (markdown) here, its result file beside it (NAME.json)")
    pr = sub.add_parser("project", help="step time, tokens/s per GPU and efficiency on 8-512 GPUs")
    model_options(pr)
    pr.add_argument("--fp8-param-gather", choices=["scales", "amax"], default="amax",
                    help="the `FP8 param gather` columns (block-scaled FP8 recipes under ZeRO-1, as "
                         "optimizer.fp8_param_gather runs it): each 128x128 block's scale gathered with the E4M3 "
                         "weights, or computed on every rank from block amaxes all-reduced first")
    pr.add_argument("--layouts", nargs="+", default=DEFAULT_LAYOUTS, help="MODEL:SEQ:tpN[cpM]:RECOMPUTE")
    pr.add_argument("--precisions", nargs="+", default=["bf16", "fp8_blockwise_ue8m0"],
                    help="cases as bench/step.py names them: PRECISION[+OVERRIDES], e.g. "
                         "bf16+optimizer.distributed=false,optimizer.overlap_grad_reduce=false")
    pr.add_argument("--gpus", type=int, nargs="+", default=[8, 64, 512])
    pr.add_argument("--mbs", type=int, default=1, help="rows per micro-batch")
    batch = pr.add_mutually_exclusive_group()
    batch.add_argument("--global-tokens", type=int, default=128 * 32768,
                       help="tokens a step, whatever the GPU count (default: InfiR2's CPT batch, 128 x 32k)")
    batch.add_argument("--accum", type=int, help="instead: micro-batches per data-parallel rank a step (weak scaling)")
    pr.add_argument("--device", default="H100",
                    help="take compute (and bandwidth) measured on this device where there is one")
    v = sub.add_parser("validate", help="predicted vs measured step time of every bench/step.py result")
    model_options(v)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    for folder in getattr(args, "results", []):
        if not folder.is_dir():
            fail(f"--results {folder}: no such folder; give folders of result folders (bench/results)")
    {"measure": measure, "project": project, "validate": validate}[args.command](args)


if __name__ == "__main__":
    main()
