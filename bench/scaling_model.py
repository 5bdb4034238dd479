"""The scaling model's arithmetic, on any machine: a collective's time from measured bus bandwidth, a GPU's
compute from a measured step, and a training step's time on a TP x CP x DP layout.

Compute. A measured step's GPU time (all its ranks') splits, by its profile's shares, into communication
(taken out), attention, the optimizer and the rest; the rest is charged to the matmul FLOPs (6 x matmul
weights a token) and attention to its own FLOPs (6 x layers x hidden x seq a token, causal). Each gives a
time per FLOP, the optimizer a time per parameter, so another model, length or layout is priced by its
own counts (infir.train.flops). A layout's GPU does 1/(tp x cp) of its replica's work (tensor parallelism
splits the matmuls and heads, context parallelism the tokens, load-balanced) and steps the optimizer over
its own parameters (ZeRO-1: 1/(dp x cp) of them). A single-GPU step without a profile charges all its
time to the FLOPs of both kinds alike.

Communication (infir.train.comm_volume gives what moves). A group of n ranks with g on each of n/g nodes
runs a collective hierarchically, as NCCL's rings over the nodes' NICs do: the g ranks of a node at the
intra-node bus bandwidth measured for g ranks at that message size, and between nodes each rank carries
1/g of the buffer at the inter-node bandwidth of one GPU (each GPU has its own NIC). Ranks are placed TP
first, then CP, then DP (megatron's order), so a TP group of up to a node's GPUs stays inside one.

Step = compute + the exposed part of TP/CP communication (`Overlap.tp_hidden` hidden) + the exposed part
of data-parallel communication: all of it without overlap; with overlap, the gradient reduction runs
beside the last micro-batch's backward and the parameter gather beside the next step's first forward,
and only what exceeds them shows, or at least one bucket of each (the last gradients are ready when
the backward ends; the first layer waits for its parameters).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace

from infir.model.qwen import QwenSize
from infir.train.comm_volume import (
    Collective, DataParallel, Layout, cp_collectives, dp_collectives, rank_params, ring_factor, tp_collectives,
)
from infir.train.flops import flops_per_token, matmul_params

GB = 1e9  # bandwidths in GB/s, as nccl-tests prints them


@dataclass(frozen=True)
class BusBandwidth:
    """Bus bandwidth (GB/s) by collective and group size over message sizes (bytes, nccl-tests' size):
    `curves[(op, ranks)]` is a list of (bytes, GB/s). Between measured sizes it is interpolated in
    log(size), outside them held at the nearest end; a group size not measured takes the nearest one
    measured (the largest below it where there is one)."""

    curves: dict = field(default_factory=dict)

    def gbs(self, op: str, ranks: int, nbytes: float) -> float:
        sizes = sorted({r for o, r in self.curves if o == op})
        if not sizes:
            raise ValueError(f"no bus bandwidth measured for {op}; measure it (bench/scaling.py measure) "
                             "or give --intra-gbs")
        below = [r for r in sizes if r <= ranks]
        curve = sorted(self.curves[(op, below[-1] if below else sizes[0])])
        xs = [math.log(b) for b, _ in curve]
        x = math.log(max(nbytes, 1.0))
        i = bisect.bisect_left(xs, x)
        if i == 0:
            return curve[0][1]
        if i == len(xs):
            return curve[-1][1]
        t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return curve[i - 1][1] + t * (curve[i][1] - curve[i - 1][1])

    @classmethod
    def flat(cls, gbs: float) -> "BusBandwidth":
        """The same bus bandwidth for every collective, group and size."""
        return cls({(op, 2): [(1.0, gbs)] for op in ("all_gather", "reduce_scatter", "all_reduce")})


@dataclass(frozen=True)
class Network:
    """Intra-node bus bandwidth (measured), inter-node bandwidth per GPU (GB/s) and GPUs per node."""

    intra: BusBandwidth
    inter_gbs: float = 50.0
    gpus_per_node: int = 8

    def per_node(self, n: int, stride: int) -> int:
        """Ranks of a group of n, `stride` apart, that share a node."""
        return max(1, min(n, self.gpus_per_node // stride))

    def seconds(self, op: str, nbytes: float, n: int, stride: int) -> float:
        """One collective of nbytes over n ranks `stride` apart: inside each node, then across nodes."""
        if n == 1:
            return 0.0
        g = self.per_node(n, stride)
        nodes = n // g
        t = nbytes * ring_factor(op, g) / (self.intra.gbs(op, g, nbytes) * GB) if g > 1 else 0.0
        if nodes > 1:
            t += nbytes / g * ring_factor(op, nodes) / (self.inter_gbs * GB)
        return t


def attention_flops(size: QwenSize, seq: int) -> float:
    return flops_per_token(size, seq) - dense_flops(size)


def dense_flops(size: QwenSize) -> float:
    return 6.0 * matmul_params(size)


@dataclass(frozen=True)
class ComputeRates:
    """Seconds per matmul FLOP, per attention FLOP and per parameter of the optimizer step, and where
    they were measured."""

    dense_s_per_flop: float
    attention_s_per_flop: float
    optimizer_s_per_param: float
    source: str = ""

    @classmethod
    def from_step(cls, size: QwenSize, seq: int, tokens: int, step_ms: float, layout: Layout, shares: dict | None,
                  source: str = "") -> "ComputeRates":
        """From a measured step of `tokens` tokens (all ranks') at `seq` on `layout`, and its profile's shares of
        GPU time (fractions by kernel class: attention, optimizer and communication are read; None: no
        profile, possible on one GPU only). Its collectives' time is taken out; the optimizer ran over one
        TP rank's parameters (the trainer's DDP keeps them whole on every data-parallel rank)."""
        if not shares and layout.gpus > 1:
            raise ValueError(f"a step on {layout.gpus} GPUs needs its profile to take its communication out ({source})")
        gpu_s = step_ms / 1e3 * layout.gpus  # GPU-seconds of the step, all ranks
        if not shares:
            per_flop = gpu_s / (tokens * flops_per_token(size, seq))
            return cls(per_flop, per_flop, 0.0, source)
        attn, opt = shares.get("attention", 0.0), shares.get("optimizer", 0.0)
        rest = 1.0 - shares.get("communication", 0.0) - attn - opt
        return cls(rest * gpu_s / (tokens * dense_flops(size)), attn * gpu_s / (tokens * attention_flops(size, seq)),
                   opt * step_ms / 1e3 / rank_params(size, layout.tp), source)

    def replica_micro_batch_s(self, size: QwenSize, seq: int, mbs: int) -> float:
        """One micro-batch's forward and backward on a whole replica (all its GPUs' work)."""
        return mbs * seq * (dense_flops(size) * self.dense_s_per_flop
                            + attention_flops(size, seq) * self.attention_s_per_flop)


@dataclass(frozen=True)
class Case:
    """One training step to price: `micro_batches` of `mbs` rows of `seq` tokens per data-parallel rank;
    `fp8_gather`: the SP gathers move FP8 bytes + scales (FP8 recipes with per-token input scales)."""

    size: QwenSize
    seq: int
    mbs: int
    micro_batches: int
    layout: Layout
    fp8_gather: bool = False


@dataclass(frozen=True)
class Overlap:
    """dp: data-parallel communication runs beside compute (megatron's overlap_grad_reduce and
    overlap_param_gather); tp_hidden: the share of TP/CP communication hidden behind compute."""

    dp: bool = False
    tp_hidden: float = 0.0


def group_shape(layout: Layout, group: str) -> tuple[int, int]:
    """(ranks, stride between them) of a rank's tp, cp or dp group (dp: the DP x CP ranks that reduce
    gradients together)."""
    return {"tp": (layout.tp, 1), "cp": (layout.cp, layout.tp), "dp": (layout.grad_ranks, layout.tp)}[group]


def comm_seconds(collectives: list[Collective], layout: Layout, net: Network) -> float:
    total = 0.0
    for c in collectives:
        n, stride = group_shape(layout, c.group)
        total += c.calls * net.seconds(c.op, c.bytes, n, stride)
    return total


def phase_seconds(collectives: list[Collective], phase: str, layout: Layout, net: Network) -> tuple[float, float]:
    """(all calls, one call) of the collectives of a phase: one bucket's time is what no overlap can hide."""
    sel = [c for c in collectives if c.phase == phase]
    return comm_seconds(sel, layout, net), comm_seconds([replace(c, calls=1) for c in sel], layout, net)


def backward_share(recompute: str) -> float:
    """The backward's share of a micro-batch's compute: 2 of 3 forward-FLOP units, 3 of 4 where full
    recomputation runs the forward again inside it."""
    return 3 / 4 if recompute == "full" else 2 / 3


def predict(case: Case, rates: ComputeRates, net: Network, dp: DataParallel, overlap: Overlap) -> dict:
    """The step's time and its parts (ms), tokens/s per GPU, and efficiency: compute over step time, the
    share of the step not spent waiting on communication."""
    lay = case.layout
    mb = rates.replica_micro_batch_s(case.size, case.seq, case.mbs) / (lay.tp * lay.cp)
    owned = rank_params(case.size, lay.tp) / (lay.grad_ranks if dp.mode == "zero1" else 1)
    compute = case.micro_batches * mb + owned * rates.optimizer_s_per_param
    per_mb = tp_collectives(case.size, case.seq, case.mbs, lay, case.fp8_gather) + cp_collectives(
        case.size, case.seq, case.mbs, lay)
    tp_cp = case.micro_batches * comm_seconds(per_mb, lay, net) * (1.0 - overlap.tp_hidden)
    steps = dp_collectives(case.size, lay, dp)
    grads, last_bucket = phase_seconds(steps, "grads", lay, net)
    params, first_bucket = phase_seconds(steps, "params", lay, net)
    if overlap.dp:  # the last gradient bucket is ready when the backward ends; the first layer waits for its gather
        bwd = backward_share(lay.recompute)
        exposed = max(last_bucket, grads - bwd * mb) + max(first_bucket, params - (1 - bwd) * mb)
    else:
        exposed = grads + params
    step = compute + tp_cp + exposed
    return {"step_ms": 1e3 * step, "compute_ms": 1e3 * compute, "tp_cp_comm_ms": 1e3 * tp_cp,
            "dp_comm_ms": 1e3 * (grads + params), "dp_exposed_ms": 1e3 * exposed,
            "tokens/s per GPU": case.micro_batches * case.mbs * case.seq / (lay.tp * lay.cp) / step,
            "efficiency": compute / step}
