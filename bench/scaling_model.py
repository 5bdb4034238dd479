"""The scaling model's arithmetic, on any machine: a collective's time from measured bus bandwidth, a GPU's
compute from a measured step, and a training step's time on a TP x CP x DP layout.

Compute. A measured step's time with its communication taken out splits, by its profile's shares of GPU
time, into GEMMs, attention, the optimizer and the rest. GEMMs are charged to the matmul FLOPs (6 x
matmul weights a token), attention to its own FLOPs (6 x layers x hidden x seq a token, causal), the
optimizer to the parameters it stepped, the FP8 weights' quantization (where its profile names it) to the
weight elements a GPU quantized (`weight_quant_elems`: once a step, or at every forward where recomputation
makes them transient), and the rest (norms, activations, residuals, copies, the activations' quantization:
work on activations, not on weights) to the layers x hidden elements of each token: a model with a wider
hidden state does more FLOPs per activation element, so pricing that work by FLOPs would charge a larger
model too much. Another model, length or layout is priced by its own counts (infir.train.flops). A
layout's GPU does 1/(tp x cp) of its replica's work (tensor parallelism splits the matmuls and heads,
sequence parallelism the rest, context parallelism the tokens, load-balanced) and steps the optimizer over
its own parameters (ZeRO-1: 1/(dp x cp) of them). A single-GPU step without a profile charges all its time
to the FLOPs of both kinds alike.

Communication (infir.train.comm_volume gives what moves). A group of n ranks with g on each of n/g nodes
runs a collective hierarchically, as NCCL's rings over the nodes' NICs do: the g ranks of a node at the
intra-node bus bandwidth measured for g ranks at that message size, and between nodes each rank carries
1/g of the buffer at the inter-node bandwidth of one GPU (each GPU has its own NIC). Ranks are placed TP
first, then CP, then DP (megatron's order), so a TP group of up to a node's GPUs stays inside one.

Step = compute + CP communication + TP communication less what its overlap takes off (`Overlap.tp_hidden`,
measured: bench/scaling.py, a step with parallel.tp_comm_overlap against its twin without) + the cost of the
data-parallel communication: all of it where the trainer does not overlap it; where it does (the gradient
buckets beside the last micro-batch's backward, the parameter gathers beside the optimizer step and the
next forward), what exceeds those windows, or at least the embedding's bucket each way (`edge_params`: its
gradients are the last ready, when the backward ends; the embedding waits for its parameters, whose gather
has only the other buckets' optimizer steps beside it), plus the contention of the rest:
overlapped collectives take SMs and memory bandwidth from the compute beside them, which slows by
`Overlap.dp_contention` times their time at intra-node bus bandwidth (their work on the GPU, which does not
depend on how slow the wire behind it is). The contention is measured (bench/scaling.py: a data-parallel
step against its one-GPU twin, apart for steps of one micro-batch per rank and of several).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace

from infir.model.qwen import QwenSize
from infir.train.comm_volume import (
    Collective, DataParallel, Layout, cp_collectives, dp_collectives, embedding_params, fp8_linear_params, rank_params,
    ring_factor, tp_collectives,
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


def activation_elements(size: QwenSize) -> float:
    """A token's elements of the residual stream, over all layers: what the non-GEMM, non-attention work scales with."""
    return float(size.layers * size.hidden)


def profiled_compute_ms(step_ms: float, shares: dict) -> float:
    """A profiled step's time less its exposed collectives. Shares are fractions of the kernel time, in which
    overlapped kernels both count: compute kernels fill 1 - communication of it, and the step waits on the
    collectives alone for `exposed communication` of it (all of communication where not profiled)."""
    comm = shares.get("communication", 0.0)
    return step_ms * (1.0 - comm) / (1.0 - comm + shares.get("exposed communication", comm))


@dataclass(frozen=True)
class ComputeRates:
    """Seconds per matmul FLOP, per attention FLOP, per parameter of the optimizer step, per activation
    element of the other work and per FP8 weight element quantized, and where they were measured."""

    dense_s_per_flop: float
    attention_s_per_flop: float
    optimizer_s_per_param: float
    elementwise_s_per_elem: float = 0.0
    source: str = ""
    weight_quant_s_per_elem: float = 0.0

    @classmethod
    def from_step(cls, size: QwenSize, seq: int, tokens: int, compute_ms: float, layout: Layout, shares: dict | None,
                  owned_params: float, source: str = "", weight_elems: float = 0.0) -> "ComputeRates":
        """From a measured step of `tokens` tokens (all ranks') at `seq` on `layout`: `compute_ms`, its time with
        its communication taken out, split by its profile's shares of GPU time (fractions of kernel time by
        class: gemm, attention, optimizer, weight quantize and communication are read; None: no profile,
        possible on one GPU only); the optimizer stepped `owned_params` and quantized `weight_elems` FP8
        weight elements on each GPU (0: its weight quantization, if any, stays with the rest)."""
        if not shares and layout.gpus > 1:
            raise ValueError(f"a step on {layout.gpus} GPUs needs its profile to take its communication out ({source})")
        gpu_s = compute_ms / 1e3 * layout.gpus  # GPU-seconds of compute, all ranks
        if not shares:
            per_flop = gpu_s / (tokens * flops_per_token(size, seq))
            return cls(per_flop, per_flop, 0.0, 0.0, source)
        kernels = 1.0 - shares.get("communication", 0.0)  # the compute kernels' part of the kernel time
        attn, opt = (shares.get(k, 0.0) / kernels for k in ("attention", "optimizer"))
        wq = shares.get("weight quantize", 0.0) / kernels if weight_elems else 0.0
        gemm = shares["gemm"] / kernels if "gemm" in shares else 1.0 - attn - opt - wq  # no GEMM class: all to FLOPs
        return cls(gemm * gpu_s / (tokens * dense_flops(size)), attn * gpu_s / (tokens * attention_flops(size, seq)),
                   opt * compute_ms / 1e3 / owned_params,
                   (1.0 - gemm - attn - opt - wq) * gpu_s / (tokens * activation_elements(size)), source,
                   wq * compute_ms / 1e3 / weight_elems if weight_elems else 0.0)

    def replica_micro_batch_s(self, size: QwenSize, seq: int, mbs: int) -> float:
        """One micro-batch's forward and backward on a whole replica (all its GPUs' work)."""
        return mbs * seq * (dense_flops(size) * self.dense_s_per_flop
                            + attention_flops(size, seq) * self.attention_s_per_flop
                            + activation_elements(size) * self.elementwise_s_per_elem)


@dataclass(frozen=True)
class Case:
    """One training step to price: `micro_batches` of `mbs` rows of `seq` tokens per data-parallel rank;
    `fp8_gather`: the SP gathers move FP8 bytes + scales (FP8 recipes with per-token input scales);
    `weight_passes`: how many times a GPU quantizes its FP8 linear weights in the step (0: no FP8 weights)."""

    size: QwenSize
    seq: int
    mbs: int
    micro_batches: int
    layout: Layout
    fp8_gather: bool = False
    weight_passes: float = 0.0


def weight_quant_elems(case: Case, dp: DataParallel) -> float:
    """FP8 linear weight elements one GPU quantizes in the step: under the FP8 parameter gather its share of them
    once (what it stepped), else its whole TP shard `case.weight_passes` times."""
    if not case.weight_passes:
        return 0.0
    fp8 = fp8_linear_params(case.size, case.layout.tp)
    return fp8 / case.layout.grad_ranks if dp.fp8_params != "off" else fp8 * case.weight_passes


@dataclass(frozen=True)
class Overlap:
    """tp_hidden: the share of TP communication the split schedules (parallel.tp_comm_overlap) take off the
    step, net of what splitting costs the compute; dp_contention: what overlapped
    data-parallel communication still costs the compute beside it, as a multiple of its time at intra-node
    bus bandwidth (0: overlap is free)."""

    tp_hidden: float = 0.0
    dp_contention: float = 0.0


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


def phase_seconds(collectives: list[Collective], phase: str, layout: Layout, net: Network) -> float:
    """All calls of the collectives of a phase."""
    return comm_seconds([c for c in collectives if c.phase == phase], layout, net)


def edge_params(case: Case, dp: DataParallel) -> float:
    """Parameters of one TP rank in the bucket no overlap hides, the last reduced and the first gathered: the
    embedding's (comm_volume.embedding_params), with what else fills that bucket up to megatron's size."""
    params = rank_params(case.size, case.layout.tp)
    return min(params, max(embedding_params(case.size, case.layout.tp), dp.bucket_elems or params))


def edge_seconds(case: Case, dp: DataParallel, net: Network) -> tuple[float, float]:
    """(gradients, parameters) of that bucket, in the phases' dtypes (the FP8 weights in it counted as the
    rest of the parameters)."""
    lay = case.layout
    elems = edge_params(case, dp)
    reduce = "all_reduce" if dp.mode == "ddp" else "reduce_scatter"
    grads = comm_seconds([Collective("edge gradients", reduce, "dp", elems * dp.grad_bytes, 1, "grads")], lay, net)
    params = 0.0 if dp.mode == "ddp" else comm_seconds(
        [Collective("edge parameters", "all_gather", "dp", elems * dp.param_bytes, 1, "params")], lay, net)
    return grads, params


def backward_share(recompute: str) -> float:
    """The backward's share of a micro-batch's compute: 2 of 3 forward-FLOP units, 3 of 4 where full
    recomputation runs the forward again inside it."""
    return 3 / 4 if recompute == "full" else 2 / 3


def dp_seconds(case: Case, net: Network, dp: DataParallel, windows: tuple[float, float],
               lead: float) -> tuple[float, float, float]:
    """(all, exposed, hidden at intra-node bus bandwidth) of the step's data-parallel communication: the
    gradients' and the parameters' phases beside the compute `windows` they may overlap (s). Overlapped, each
    phase still shows its edge bucket (`edge_seconds`): its gradients once the backward has ended, and its
    parameters' gather less the `lead` of compute beside it (the trainer steps that bucket first and gathers it
    beside the other buckets' steps)."""
    lay = case.layout
    steps = dp_collectives(case.size, lay, dp)
    in_node = replace(net, gpus_per_node=max(net.gpus_per_node, lay.gpus))  # the same groups inside one node
    edges = edge_seconds(case, dp, net)
    total = exposed = hidden = 0.0
    for phase, window, edge in zip(("grads", "params"), windows, (edges[0], max(0.0, edges[1] - lead))):
        t = phase_seconds(steps, phase, lay, net)
        shown = max(min(edge, t), t - window) if dp.overlap else t
        total, exposed = total + t, exposed + shown
        if t > 0:
            hidden += (t - shown) * phase_seconds(steps, phase, lay, in_node) / t
    return total, exposed, hidden


def predict(case: Case, rates: ComputeRates, net: Network, dp: DataParallel, overlap: Overlap) -> dict:
    """The step's time and its parts (ms), tokens/s per GPU, and efficiency: compute over step time, the
    share of the step not spent waiting on communication. dp_cost_ms: what data parallelism adds to the
    step (its exposed part and its contention); dp_hidden_ms: its overlapped part, at intra-node bandwidth."""
    lay = case.layout
    mb = rates.replica_micro_batch_s(case.size, case.seq, case.mbs) / (lay.tp * lay.cp)
    owned = rank_params(case.size, lay.tp) / (lay.grad_ranks if dp.mode == "zero1" else 1)
    optimizer = owned * rates.optimizer_s_per_param
    compute = case.micro_batches * mb + optimizer + weight_quant_elems(case, dp) * rates.weight_quant_s_per_elem
    tp = comm_seconds(tp_collectives(case.size, case.seq, case.mbs, lay, case.fp8_gather), lay, net)
    cp = comm_seconds(cp_collectives(case.size, case.seq, case.mbs, lay), lay, net)
    tp_cp = case.micro_batches * (tp * (1.0 - overlap.tp_hidden) + cp)
    bwd = backward_share(lay.recompute)  # gradients beside the last backward; parameters beside the step and next forward
    # the embedding's gather starts once its own step is done, beside the other buckets' (not under the FP8
    # parameter gather, whose gathers wait for every bucket's block amaxes)
    edge_share = edge_params(case, dp) / rank_params(case.size, lay.tp)
    lead = 0.0 if dp.fp8_params != "off" else optimizer * (1 - edge_share)
    total, exposed, hidden = dp_seconds(case, net, dp, (bwd * mb, optimizer + (1 - bwd) * mb), lead)
    cost = exposed + overlap.dp_contention * hidden
    step = compute + tp_cp + cost
    return {"step_ms": 1e3 * step, "compute_ms": 1e3 * compute, "tp_cp_comm_ms": 1e3 * tp_cp,
            "dp_comm_ms": 1e3 * total, "dp_cost_ms": 1e3 * cost, "dp_hidden_ms": 1e3 * hidden,
            "tokens/s per GPU": case.micro_batches * case.mbs * case.seq / (lay.tp * lay.cp) / step,
            "efficiency": compute / step}
