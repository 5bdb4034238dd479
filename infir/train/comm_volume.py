"""What a training step sends between ranks: each collective's size and count, for a TP x CP x DP layout.

The trainer's traffic, as infir.model's layers and megatron-core's DDP issue it:
- Tensor parallel with sequence parallelism (SP), per layer and micro-batch: the column-parallel linears
  (QKV, FC1) all-gather their input's sequence shards and reduce-scatter its gradient; the row-parallel
  ones (attention output, FC2) reduce-scatter their output and all-gather its gradient. FP8 recipes whose
  inputs carry per-token (1x128) scales gather the FP8 bytes + FP32 scales instead of BF16
  (infir.fp8.SequenceParallel) and keep only X^T's shards, so backward gathers those again for the
  weight gradient; BF16 keeps the gathered input itself and gathers nothing more.
- Tensor parallel without SP: the row outputs all-reduced forward, the column inputs' gradients backward.
- Once per micro-batch around the layers: the embedding's output (reduce-scatter, or all-reduce without
  SP) and the LM head's input (all-gather under SP; without SP its gradient is all-reduced).
- Full recomputation runs each layer's forward again inside its backward, collectives included;
  selective recomputation reruns core attention only, which holds the context-parallel K/V gather.
- Context parallelism: each layer all-gathers K and V over the CP ranks (kv_heads / tp heads wide: GQA
  keeps them small) and reduce-scatters their gradients.
- Data parallel, once per step, over the DP x CP ranks (CP ranks hold the same weights), as
  infir.train.optimizer runs it (`trainer_data_parallel`): with the states replicated, DDP all-reduces the
  gradients; with them sharded (ZeRO-1, the default wherever DP x CP > 1) it reduce-scatters them and
  all-gathers the updated parameters in the optimizer's parameter dtype (FP32 for adamw, BF16 for the BF16
  optimizers), FP32 ones as BF16 under BF16 autocast but the FP8 linears' weights, which FP8 recipes quantize
  from FP32 on every rank (`DataParallel.fp8_weight_bytes`). Gradients move in `optimizer.grad_reduce_dtype`,
  in megatron's buckets where they overlap the backward, else in one.
- FP8 parameter all-gather (ZeRO-1, block-scaled FP8 recipes; `DataParallel.fp8_params`): the FP8 linears'
  weights (QKV, proj, FC1, FC2) move as E4M3 bytes, what their GEMMs read, and the rest (embedding, LM head,
  norms, biases) as the parameters do. Each 128x128 block's FP32 scale either moves with them
  ("scales"), or every rank computes it from the block's amax, all-reduced (MAX) over the DP ranks first
  ("amax": a shard boundary may split a block, so no one rank sees all of it).

Sizes follow nccl-tests: `Collective.bytes` is the whole buffer (the gathered tensor of an all-gather, the
input of a reduce-scatter or all-reduce), of which each of n ranks sends `ring_factor(op, n)` times.
Left out as too small to matter: the LM loss's per-token all-reduces and the SP norm weights' gradients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from infir.model.qwen import QwenSize
from infir.train.optimizer import sharded_optimizer

ACT_BYTES = 2  # BF16 activations and activation gradients
FP8_TOKEN_BYTES = 1 + 4 / 128  # an E4M3 byte, plus one FP32 scale per 1x128 block
BLOCK_SCALE_BYTES = 4 / (128 * 128)  # one FP32 scale (or amax) per 128x128 block of a weight
FP8_PARAM_GATHERS = ("off", "scales", "amax")
OPS = ("all_gather", "reduce_scatter", "all_reduce")
RECOMPUTE = ("none", "selective", "full")
DP_MODES = ("ddp", "zero1")
MEGATRON_BUCKET_ELEMS = 40_000_000  # megatron DDP's smallest default bucket, where it overlaps: max(40M, 1M x DP)


def ring_factor(op: str, n: int) -> float:
    """The share of a collective's buffer each rank sends (nccl-tests' bus-bandwidth factor)."""
    if op not in OPS:
        raise ValueError(f"collective {op!r}; valid: {list(OPS)}")
    return (2.0 if op == "all_reduce" else 1.0) * (n - 1) / n


@dataclass(frozen=True)
class Layout:
    """How ranks split the model: tp x cp ranks hold one replica, dp replicas."""

    tp: int = 1
    cp: int = 1
    dp: int = 1
    sequence_parallel: bool = True
    recompute: str = "none"

    def __post_init__(self):
        for key in ("tp", "cp", "dp"):
            if getattr(self, key) < 1:
                raise ValueError(f"layout {key}={getattr(self, key)} must be >= 1")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"layout recompute={self.recompute!r}; valid: {list(RECOMPUTE)}")

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.dp

    @property
    def grad_ranks(self) -> int:
        """The ranks that hold the same weights and reduce their gradients together."""
        return self.dp * self.cp

    @property
    def name(self) -> str:
        parts = [f"tp{self.tp}"] + ([f"cp{self.cp}"] if self.cp > 1 else []) + [f"dp{self.dp}"]
        return "x".join(parts) + ("" if self.sequence_parallel or self.tp == 1 else " (no SP)")


@dataclass(frozen=True)
class DataParallel:
    """The gradient reduction: `mode` ddp (all-reduce) or zero1 (reduce-scatter + parameter all-gather),
    bytes per gradient and per gathered parameter, the bucket size in elements (None: one bucket,
    megatron's DDP without overlap), and whether the buckets overlap compute (the gradients' the last
    backward, the parameters' the optimizer step and the next forward); `fp8_params` (ZeRO-1 only): off, or the
    FP8 linears' weights gathered as E4M3 bytes with their block scales ("scales") or after an all-reduce of
    their block amaxes ("amax"); `fp8_weight_bytes` (ZeRO-1, fp8_params off): bytes per element of the FP8
    linears' weights where they cross wider than the rest (FP32 masters beside a BF16 gather), None: as the rest."""

    mode: str = "ddp"
    grad_bytes: float = 4
    param_bytes: float = 4
    bucket_elems: int | None = None
    overlap: bool = False
    fp8_params: str = "off"
    fp8_weight_bytes: float | None = None

    def __post_init__(self):
        if self.mode not in DP_MODES:
            raise ValueError(f"data-parallel mode {self.mode!r}; valid: {list(DP_MODES)}")
        if self.fp8_params not in FP8_PARAM_GATHERS:
            raise ValueError(f"fp8_params={self.fp8_params!r}; valid: {list(FP8_PARAM_GATHERS)}")
        if self.fp8_params != "off" and self.mode != "zero1":
            raise ValueError("fp8_params gathers sharded parameters: it needs mode='zero1'")
        if self.fp8_weight_bytes is not None and (self.mode != "zero1" or self.fp8_params != "off"):
            raise ValueError("fp8_weight_bytes prices the FP8 weights of a plain ZeRO-1 gather: mode='zero1', fp8_params='off'")


def trainer_data_parallel(oc, layout: Layout, fp8_params: str = "off", bf16_params: bool = False,
                          fp8_linears: bool = False) -> DataParallel:
    """What the trainer runs for optimizer config `oc` (infir.train.schema.OptimizerConfig) on `layout`:
    ZeRO-1 where it shards the states, else DDP; gradients in `oc.grad_reduce_dtype`; parameters gathered in
    the optimizer's parameter dtype, or in BF16 where `bf16_params` (FP32 parameters under BF16 autocast) but
    for the weights of the FP8 linears where the model has them (`fp8_linears`): in the parameters' dtype, or
    as `fp8_params` says where it shards them; megatron's buckets (`oc.bucket_size`, else max(40M, 1M x DP)
    elements) where they overlap, one where not."""
    from infir.optim import optimizer_spec

    buckets = (oc.bucket_size or max(MEGATRON_BUCKET_ELEMS, 1_000_000 * layout.dp)) if oc.overlap_grad_reduce else None
    sharded = sharded_optimizer(oc, layout.grad_ranks)
    master = param_bytes = optimizer_spec(oc.name).param_dtype.itemsize
    if sharded and bf16_params:
        param_bytes = min(param_bytes, 2)
    fp8 = fp8_params if sharded else "off"
    wider = master if sharded and fp8_linears and fp8 == "off" and master > param_bytes else None
    return DataParallel("zero1" if sharded else "ddp", 4 if oc.grad_reduce_dtype == "fp32" else 2,
                        param_bytes, buckets, oc.overlap_grad_reduce, fp8, wider)


@dataclass(frozen=True)
class Collective:
    """`calls` collectives of `bytes` each over the `group` ranks (tp, cp or dp), in `phase`: fwd, bwd
    (per micro-batch), grads or params (per step)."""

    name: str
    op: str
    group: str
    bytes: float
    calls: int
    phase: str

    def sent_bytes(self, n: int) -> float:
        """What each of the group's n ranks sends for all `calls`."""
        return self.calls * self.bytes * ring_factor(self.op, n)


def rank_params(size: QwenSize, tp: int) -> float:
    """Parameters one tensor-parallel rank holds: everything split tp ways but the norms' weights."""
    norms = (2 * size.layers + 1) * size.hidden
    return (size.num_params() - norms) / tp + norms


def embedding_params(size: QwenSize, tp: int) -> float:
    """The input embedding's weight on one tensor-parallel rank (vocab-parallel). Megatron's DDP fills its
    buckets in reverse parameter order and this weight, larger than a bucket, closes the last one: its
    gradients are the last reduced (the embedding's backward ends the step's) and its parameters the first the
    next forward reads. Tied to the LM head it is the same weight."""
    return size.vocab * size.hidden / tp


def fp8_linear_params(size: QwenSize, tp: int) -> float:
    """Weights of one tensor-parallel rank's FP8 linears: QKV, proj, FC1 (gate and up) and FC2 of every layer."""
    d, kv = size.hidden, size.kv_heads * size.head_dim
    return size.layers * (d * (d + 2 * kv) + d * d + 3 * d * size.ffn) / tp


def tp_collectives(size: QwenSize, seq: int, mbs: int, layout: Layout, fp8_gather: bool = False) -> list[Collective]:
    """One micro-batch's tensor-parallel collectives (none at tp=1). Each layer has two of each kind: one
    for attention (QKV in, proj out), one for the MLP (FC1 in, FC2 out)."""
    if layout.tp == 1:
        return []
    act = mbs * seq // layout.cp * size.hidden * ACT_BYTES  # one hidden-state tensor of the replica's tokens
    fwd = 2 * size.layers * (2 if layout.recompute == "full" else 1)  # per kind, recomputed forwards included
    bwd = 2 * size.layers
    if not layout.sequence_parallel:
        return [Collective("proj/FC2 outputs", "all_reduce", "tp", act, fwd, "fwd"),
                Collective("QKV/FC1 input grads", "all_reduce", "tp", act, bwd, "bwd"),
                Collective("embedding output", "all_reduce", "tp", act, 1, "fwd"),
                Collective("LM head input grad", "all_reduce", "tp", act, 1, "bwd")]
    gathered = act * FP8_TOKEN_BYTES / ACT_BYTES if fp8_gather else act
    out = [Collective("QKV/FC1 inputs", "all_gather", "tp", gathered, fwd, "fwd"),
           Collective("proj/FC2 outputs", "reduce_scatter", "tp", act, fwd, "fwd"),
           Collective("QKV/FC1 input grads", "reduce_scatter", "tp", act, bwd, "bwd"),
           Collective("proj/FC2 output grads", "all_gather", "tp", act, bwd, "bwd"),
           Collective("embedding output", "reduce_scatter", "tp", act, 1, "fwd"),
           Collective("embedding output grad", "all_gather", "tp", act, 1, "bwd"),
           Collective("LM head input", "all_gather", "tp", act, 1, "fwd"),
           Collective("LM head input grad", "reduce_scatter", "tp", act, 1, "bwd")]
    if fp8_gather:  # X^T's FP8 shards, gathered again for each column-parallel weight gradient
        out.append(Collective("QKV/FC1 inputs for wgrad", "all_gather", "tp", gathered, bwd, "bwd"))
    return out


def cp_collectives(size: QwenSize, seq: int, mbs: int, layout: Layout) -> list[Collective]:
    """One micro-batch's context-parallel collectives: each layer's K and V (none at cp=1)."""
    if layout.cp == 1:
        return []
    kv = mbs * seq * size.kv_heads // layout.tp * size.head_dim * ACT_BYTES  # the whole sequence's K (or V)
    passes = 1 if layout.recompute == "none" else 2  # the gather is inside core attention, which both modes recompute
    return [Collective("K/V", "all_gather", "cp", kv, 2 * size.layers * passes, "fwd"),
            Collective("K/V grads", "reduce_scatter", "cp", kv, 2 * size.layers, "bwd")]


def dp_collectives(size: QwenSize, layout: Layout, dp: DataParallel) -> list[Collective]:
    """One step's data-parallel collectives over the layout's grad_ranks (none where that is 1)."""
    if layout.grad_ranks == 1:
        return []
    params = rank_params(size, layout.tp)
    buckets = 1 if dp.bucket_elems is None else max(1, math.ceil(params / dp.bucket_elems))
    grads = params * dp.grad_bytes / buckets
    if dp.mode == "ddp":
        return [Collective("gradients", "all_reduce", "dp", grads, buckets, "grads")]
    fp8 = 0.0 if dp.fp8_params == "off" and dp.fp8_weight_bytes is None else fp8_linear_params(size, layout.tp)
    fp8_bytes = (dp.fp8_weight_bytes if dp.fp8_weight_bytes is not None else
                 1 + (BLOCK_SCALE_BYTES if dp.fp8_params == "scales" else 0))
    gathered = (params - fp8) * dp.param_bytes + fp8 * fp8_bytes
    out = [Collective("gradients", "reduce_scatter", "dp", grads, buckets, "grads"),
           Collective("parameters", "all_gather", "dp", gathered / buckets, buckets, "params")]
    if dp.fp8_params == "amax":
        out.append(Collective("block amaxes", "all_reduce", "dp", fp8 * BLOCK_SCALE_BYTES / buckets, buckets, "params"))
    return out
