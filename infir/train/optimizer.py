"""The trainer's optimizer over megatron-core DDP's buffers: replicated on every data-parallel rank,
or sharded over them (ZeRO-1, `optimizer.distributed`).

Why not megatron's DistributedOptimizer: it keeps an FP32 master copy of every BF16 parameter and
steps torch's Adam over FP32 shards of it, the bytes that infir.optim's optimizers (BF16 weights,
8-bit or BF16 states) exist to remove, and it allocates on 'cuda' unconditionally. What it is built
on is reused here: DDP's contiguous parameter and gradient buffers, whose buckets megatron
reduce-scatters while backward still runs (`overlap_grad_reduce`). Each rank steps its share of
every bucket, through views into the parameters (infir.optim.shard_view: the random bits and
quantization groups of the unsharded step, so sharding changes no number), then starts the all-gather
of the bucket's updated parameters; the next forward waits for each bucket only where a layer first
reads it (`overlap_gathers_with_forward`). Checkpointed states carry their element ranges, so a run
resumes at another data-parallel size or with(out) sharding (`load_resharded`); `whole_states` and
`load_whole` are its two halves, between which a resume at another tensor-parallel size re-cuts each
parameter's state as its weight (infir/train/reshard.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist


@dataclass
class _Part:
    """One optimizer over the views it steps; with sharding, one bucket's share and its gather."""
    optimizer: torch.optim.Optimizer | None  # None: this rank's share of the bucket is padding only
    views: list[torch.Tensor]
    bucket: object = None  # megatron's _ParamAndGradBucket, when sharded
    buffer: object = None  # the DDP buffer holding it
    layout: tuple = ()  # (index, offset, numel) per view: the element ranges its saved states cover


def _saved_parts(saved: list[dict], numel: list[int]):
    """(layout, optimizer state_dict) of every optimizer in `saved`: a replicated state_dict holds every
    parameter whole, in index order."""
    for state in saved:
        if "shards" in state:
            yield from ((layout, sd) for layout, sd in zip(state["shards"], state["optimizers"]) if sd is not None)
        else:
            yield tuple((i, 0, n) for i, n in enumerate(numel)), state


def weight_decay_groups(params: list, weight_decay: float) -> list[dict]:
    """Decoupled weight decay on matrices only (not on norms and biases): matrices first, the order
    in which every param (or shard of it) is indexed."""
    def matrix(p) -> bool:
        return getattr(p, "whole", p).ndim >= 2  # a shard is 1-D: its parameter's shape decides

    return [{"params": [p for p in params if matrix(p)], "weight_decay": weight_decay},
            {"params": [p for p in params if not matrix(p)], "weight_decay": 0.0}]


def sharded_optimizer(oc, grad_ranks: int) -> bool:
    """Whether optimizer config `oc` shards the states over the `grad_ranks` data-parallel (x context-parallel)
    ranks: `optimizer.distributed`, or, where that is null, whenever there is more than one."""
    return grad_ranks > 1 if oc.distributed is None else bool(oc.distributed)


def fp8_param_gather(oc, recipe, sharded: bool) -> bool:
    """Whether the FP8 linears' weights are all-gathered as FP8 (`optimizer.fp8_param_gather`, which needs
    sharded states and a recipe of 128x128 weight blocks)."""
    from infir.train.config import ConfigError
    from infir.train.fp8_param_gather import gathers_in_fp8

    if oc.fp8_param_gather and not (sharded and gathers_in_fp8(recipe)):
        raise ConfigError("optimizer.fp8_param_gather=true needs sharded optimizer states: more than one data-parallel "
                          "rank, or optimizer.distributed=true; set it to false for this run")
    return oc.fp8_param_gather


def bf16_param_gather(recipe, sharded: bool) -> bool:
    """Whether sharded FP32 parameters are all-gathered as BF16 (param_gather.py) where that is narrower: under
    BF16 autocast, where every read of them but two kinds is rounded to BF16 anyway. The RMSNorm weights are
    read in FP32, and an FP8 recipe quantizes each FP8 linear's FP32 weight itself on every rank: those cross
    exactly (the FP8 weights as FP8 under `optimizer.fp8_param_gather`). FP32 runs compute in FP32."""
    return sharded and recipe.compute_dtype == torch.bfloat16


def _read_exact(model: torch.nn.Module) -> set:
    """The parameters every rank reads exactly in FP32: the RMSNorm weights, and the FP8 linears' weights (each
    rank quantizes its FP32 weight)."""
    from infir.model.fp8_linears import fp8_linears_of
    from infir.model.norm import RMSNorm

    return ({p for m in model.modules() if isinstance(m, RMSNorm) for p in m.parameters()}
            | {m.weight for m in fp8_linears_of(model)})


class DataParallelOptimizer:
    """`build(param_groups)` (an infir.optim optimizer) over the DDP model's parameters, whole, or
    over this rank's share of each bucket when `ddp` was built with `use_distributed_optimizer`.

    Every view it steps carries `main_grad` (its slice of DDP's gradient buffer); `counted` says
    which count toward the gradient norm (tensor-parallel duplicates are counted on one rank only)."""

    def __init__(self, ddp, params: list, build: Callable[[list], torch.optim.Optimizer], weight_decay: float):
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        # a model without megatron's DDP (gradient release, NoDataParallel) has no ddp_config: replicated
        self.sharded = bool(getattr(getattr(ddp, "ddp_config", None), "use_distributed_optimizer", False))
        self.group = ddp.intra_dp_cp_group if self.sharded else None
        groups = weight_decay_groups(params, weight_decay)
        order = [p for g in groups for p in g["params"]]
        self._numel = [p.numel() for p in order]  # by index: the whole parameters' sizes
        names = {p: name for name, p in ddp.module.named_parameters()}
        # by index: each parameter's name in the model's state dict, which tells its tensor-parallel layout
        self.param_names = [names[p] for p in order]
        self.param_shapes = [tuple(p.shape) for p in order]
        if not self.sharded:
            self.parts = [_Part(build(groups), order, layout=tuple((i, 0, p.numel()) for i, p in enumerate(order)))]
        else:
            index = {p: i for i, p in enumerate(order)}
            self.parts = [self._bucket_part(buffer, bucket, index, build, weight_decay)
                          for buffer in ddp.buffers for bucket in buffer.buckets]
        self.views = [v for part in self.parts for v in part.views]
        self._queue: list = []  # buckets whose parameter gather the last step queued and has not started
        self._pending: dict = {}  # bucket -> its started parameter gather's works, until a forward reads it
        self._fp8: dict = {}  # bucket -> its BucketFp8Gather, where its FP8 weights cross as FP8 (narrow_gathers)
        self._bf16: dict = {}  # bucket -> its BucketBf16Gather, where its FP32 parameters cross as BF16 (narrow_gathers)
        self._params_behind = False  # whether a narrower gather left other ranks' elements of the parameters inexact
        self._bucket_of = {p: part.bucket for part in self.parts if part.bucket is not None for p in part.bucket.params}
        self.counted = [param_is_not_tensor_parallel_duplicate(getattr(v, "whole", v)) for v in self.views]

    def _bucket_part(self, buffer, bucket, index: dict, build, weight_decay: float) -> _Part:
        from infir.optim import shard_view

        ranks, rank = self.group.size(), self.group.rank()
        size = bucket.grad_data.numel() // ranks
        lo = bucket.offset + rank * size
        hi = lo + size
        views = []
        for p in sorted(bucket.params, key=lambda q: buffer.param_index_map[q][0]):
            start, end, _ = buffer.param_index_map[p]
            a, b = max(start, lo) - start, min(end, hi) - start
            if a >= b:
                continue
            view = shard_view(p, a, b, index[p])
            view.main_grad = p.main_grad.view(-1)[a:b]
            view.whole = p
            views.append(view)
        groups = [g for g in weight_decay_groups(views, weight_decay) if g["params"]]
        views = [v for g in groups for v in g["params"]]
        layout = tuple((v.shard.index, v.shard.offset, v.numel()) for v in views)
        return _Part(build(groups) if groups else None, views, bucket, buffer, layout)

    @property
    def shard_rank(self) -> int:
        """This rank's share of the states: its rank among the data-parallel (x context-parallel) ranks."""
        return self.group.rank() if self.sharded else 0

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [part.optimizer for part in self.parts if part.optimizer is not None]

    def state_bytes(self, device: torch.device) -> int:
        """Bytes of this rank's optimizer states held on `device` (on a GPU run, not an offloading optimizer's
        host copies): what sharding divides over the ranks."""
        return sum(t.numel() * t.element_size() for opt in self.optimizers for state in opt.state.values()
                   for t in state.values() if isinstance(t, torch.Tensor) and t.device == device)

    def grad_norm_sq(self) -> torch.Tensor:
        """Sum of squared gradients of this rank's views (counted ones), summed over the shards' ranks."""
        grads = [v.main_grad for v, c in zip(self.views, self.counted) if c]
        device = self.views[0].device if self.views else torch.device("cpu")
        # FP64 sums: FP32's CPU reduction drifts over a million elements, and by a different amount for each
        # way of cutting the parameters into shards (the clipping, and so the step, would depend on it)
        sq = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float64)).pow(2).sum() if grads \
            else torch.zeros((), dtype=torch.float64, device=device)
        if self.sharded:
            dist.all_reduce(sq, group=self.group)
        return sq

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next update, for steps taken inside backward (gradient release)."""
        for optimizer in self.optimizers:
            for g in optimizer.param_groups:
                g["lr"] = lr

    def release_grads(self, model: torch.nn.Module):
        """Gradient release (FlashOptim): each parameter steps in its post-accumulate-grad hook during backward
        and its gradient is freed at once, so no gradient of the whole model is ever held (infir.optim
        release.py). One rank, no DDP buffers: the loop makes sure of it (Trainer)."""
        from infir.optim import enable_step_in_backward

        if self.sharded or len(self.optimizers) != 1:
            raise ValueError("gradient release steps one replicated optimizer on one rank")
        return enable_step_in_backward(self.optimizers[0], model, release_grads=True)

    def scale_grads(self, coef: float) -> None:
        torch._foreach_mul_([v.main_grad for v in self.views], coef)

    def step(self, lr: float, grads_in_dot_grad: bool, grad_scale: torch.Tensor | None = None) -> None:
        """Step every view at learning rate `lr` (`grad_scale`: the fused clipping of optimizers that
        divide by it in their kernel); sharded, queue each bucket's parameter gather behind its step.
        Buckets hold the parameters last-used-first: they step from the last, so that the queue is in the
        order the next forward reads them. The first bucket's gather starts at once, beside the other
        buckets' steps; each later one when the forward reaches the bucket before it (`wait_for`)."""
        self._queue = []
        order = list(reversed(self.parts))
        # The bucket the forward reads first steps alone, its gather beside the rest's step, which is one call
        # (infir.optim.step_together): a step per bucket, a few small kernels each behind host time, left the
        # GPU waiting on the host.
        for batch in (order[:1], order[1:]):
            self._step_parts(batch, lr, grads_in_dot_grad, grad_scale)
            for part in batch:
                if part.bucket is None:
                    continue
                self._queue.append(part.bucket)
                for p in part.bucket.params:
                    p.gather_pending = True
                # A bucket's FP8 gather needs every bucket's scales (exchange_scales, after all steps); one without
                # FP8 weights (the embedding's, read first) gathers beside the rest's step and the exchange's host
                # time, instead of after them with the GPU waiting for it
                if not self._pending and self._queue[0] not in self._fp8:
                    self._start_next()
        if self._bf16:
            self._params_behind = True
        if self._fp8:
            self._fp8_gather.exchange_scales()
            self._params_behind = True
            if not self._pending:
                self._start_next()

    def _start_next(self) -> None:
        """Start the gather of the next queued bucket. One gather runs ahead of the forward, never more: with
        CUDA_DEVICE_MAX_CONNECTIONS=1 every stream's work enters the GPU through one queue, in the order it was
        issued, and a collective waiting there for the one before it on the communication stream holds up the
        compute issued after it (started all at once, the gathers ran one after another with the GPU
        otherwise idle, and the forward began once the last of them was under way)."""
        if self._queue:
            bucket = self._queue.pop(0)
            narrow = self._narrow(bucket)
            self._pending[bucket] = narrow.start() if narrow is not None else [self._gather(bucket)]

    def _narrow(self, bucket):
        """The bucket's gather in a narrower dtype than its parameters (FP8 or BF16), or None."""
        return self._fp8.get(bucket) or self._bf16.get(bucket)

    def wait_for(self, params) -> list:
        """Wait for the gathers of the buckets holding `params` (starting them, and the queued ones before
        them, where they have not started), then start the next; the parameters they completed."""
        needed = {self._bucket_of.get(p) for p in params}
        while needed.intersection(self._queue):
            self._start_next()
        done, buckets = [], []
        for p in params:
            bucket = self._bucket_of.get(p)
            works = self._pending.pop(bucket, None)
            if works is None:
                continue
            narrow = self._narrow(bucket)
            if narrow is not None:
                narrow.finish(works)
            else:
                for work in works:
                    work.wait()
            done.extend(bucket.params)
            buckets.append(bucket)
        if done:
            if not self._pending:
                self._start_next()
            # The gather wrote the parameters through the bucket's buffer, which autograd does not see
            # as a write to them: their version counters say so, for what caches a weight by its version
            # (the FP8 weight caches, which then adopt the gathered FP8 weights where those came as such).
            from torch.autograd.graph import increment_version

            increment_version(done)
            for p in done:
                p.gather_pending = False
            for bucket in buckets:
                if bucket in self._fp8:
                    self._fp8[bucket].adopt()
        return done

    def finish_gathers(self) -> None:
        """Wait for every pending parameter gather, and gather the parameters in full where the FP8 gather
        left other ranks' elements behind (before weights are read or written outside a forward)."""
        while self._queue:
            self._start_next()
        self.wait_for([p for bucket in list(self._pending) for p in bucket.params])
        if self._params_behind:
            for narrow in (*self._fp8.values(), *self._bf16.values()):
                narrow.sync_params()
            self._params_behind = False

    def narrow_gathers(self, model: torch.nn.Module, fp8: bool, bf16: bool) -> None:
        """From now on each bucket's parameter gather sends the fewest bytes of: its FP8 linears' weights as FP8
        (`fp8`, fp8_param_gather.py), its FP32 parameters as BF16 with the weights read in FP32 exact (`bf16`:
        BF16 autocast, param_gather.py), or its parameters as they are. Sharded states only."""
        from infir.train.fp8_param_gather import BucketFp8Gather, Fp8ParamGather, fp8_targets
        from infir.train.param_gather import BucketBf16Gather

        if not self.sharded:
            raise ValueError("narrower parameter gathers run under sharded optimizer states (optimizer.distributed)")
        targets, recipe = fp8_targets(model) if fp8 else ({}, None)
        exact = _read_exact(model)
        for part in self.parts:
            bucket, ways = part.bucket, []
            if any(p in targets for p in bucket.params):
                ways.append(BucketFp8Gather(part.buffer, bucket, self.group, targets, recipe))
            if bf16 and bucket.param_data.dtype == torch.float32:
                ways.append(BucketBf16Gather(part.buffer, bucket, self.group, exact))
            way = min(ways, key=lambda w: w.wire_bytes, default=None)
            if way is not None and way.wire_bytes < self._plain_bytes(bucket):
                (self._fp8 if isinstance(way, BucketFp8Gather) else self._bf16)[bucket] = way
        if self._fp8:
            self._fp8_gather = Fp8ParamGather(list(self._fp8.values()), self.group)

    @property
    def gathers_fp8(self) -> bool:
        return bool(self._fp8)

    @property
    def gathers_bf16(self) -> bool:
        return bool(self._bf16)

    @property
    def gather_dtypes(self) -> str:
        """What the parameter gathers send narrower than the parameters, in words ('' where nothing)."""
        if self.gathers_fp8:
            return "FP8 weights as FP8" + (", buckets without them as BF16" if self.gathers_bf16 else "")
        return "as BF16 where narrower, weights read in FP32 exact" if self.gathers_bf16 else ""

    @property
    def gather_bytes(self) -> int:
        """Bytes this rank sends in one step's parameter gathers (0 with replicated states)."""
        if not self.sharded:
            return 0
        return sum(self._narrow(part.bucket).wire_bytes if self._narrow(part.bucket) else self._plain_bytes(part.bucket)
                   for part in self.parts)

    def _plain_bytes(self, bucket) -> int:
        return bucket.param_data.numel() // self.group.size() * bucket.param_data.element_size()

    @staticmethod
    def _step_parts(parts: list[_Part], lr: float, grads_in_dot_grad: bool, grad_scale) -> None:
        from infir.optim import step_together

        parts = [part for part in parts if part.optimizer is not None]
        for part in parts:
            if grads_in_dot_grad:
                for v in part.views:
                    v.grad = v.main_grad
            for g in part.optimizer.param_groups:
                g["lr"] = lr
            part.optimizer.grad_scale = grad_scale
        step_together([part.optimizer for part in parts])
        for part in parts:
            part.optimizer.grad_scale = None
            for v in part.views:
                v.grad = None  # DDP's hooks accumulate into main_grad; a stale .grad would be added twice

    def _gather(self, bucket):
        from infir.train.param_gather import gather_full

        return gather_full(bucket.param_data, self.group, async_op=True)

    # --- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if not self.sharded:
            return self.parts[0].optimizer.state_dict()
        return {"shards": [part.layout for part in self.parts],
                "optimizers": [None if part.optimizer is None else part.optimizer.state_dict() for part in self.parts]}

    def layout_matches(self, state: dict) -> bool:
        """Whether `state` (a state_dict() of a run) holds exactly this rank's views, as they are cut here."""
        if not self.sharded:
            return "shards" not in state
        return state.get("shards") == [part.layout for part in self.parts]

    def load_state_dict(self, state: dict) -> None:
        """States saved by a rank whose views were cut as this one's (`layout_matches`)."""
        if not self.layout_matches(state):
            raise ValueError("the saved optimizer states are cut otherwise than this rank's views: use load_resharded")
        if not self.sharded:
            self.parts[0].optimizer.load_state_dict(state)
            return
        for part, saved in zip(self.parts, state["optimizers"]):
            if part.optimizer is not None:
                part.optimizer.load_state_dict(saved)

    def load_resharded(self, saved: list[dict]) -> None:
        """This rank's states from the state_dict()s of every rank of a run with another number of shards
        (replicated, or sharded over another data-parallel size or bucket size): each parameter's state is
        joined from the saved ranges and cut into this rank's."""
        self.load_whole(self.whole_states(saved, self._numel))

    @property
    def state_kind(self) -> type | None:
        """The class of the optimizers this rank steps (None: it steps none)."""
        return type(self.optimizers[0]) if self.optimizers else None

    def whole_states(self, saved: list[dict], numel: list[int]) -> dict[int, dict]:
        """The whole state (ranges.merge_ranges) of each parameter this rank steps, by index, joined from
        the state_dict()s of the data-parallel ranks of one run that held it, cut in any way; `numel`:
        the parameters' sizes there (another tensor-parallel size has others)."""
        from infir.optim.base import unpacked_state
        from infir.optim.ranges import merge_ranges

        wanted = {i for part in self.parts for i, _, _ in part.layout}
        pieces: dict[int, list] = {}
        for layout, sd in _saved_parts(saved, numel):
            for j, (index, offset, n) in enumerate(layout):
                if index in wanted and j in sd["state"]:
                    pieces.setdefault(index, []).append((offset, n, unpacked_state(sd["state"][j])))
        grouped = getattr(self.state_kind, "GROUPED_STATES", {})
        return {index: merge_ranges(p, numel[index], grouped) for index, p in pieces.items()}

    def load_whole(self, whole: dict[int, dict]) -> None:
        """This rank's states cut from each parameter's whole state (whole_states), by index."""
        from infir.optim.ranges import state_range

        for part in self.parts:
            if part.optimizer is None:
                continue
            grouped = getattr(part.optimizer, "GROUPED_STATES", {})
            target = part.optimizer.state_dict()
            target["state"] = {}
            for j, ((index, offset, numel), view) in enumerate(zip(part.layout, part.views)):
                if index in whole:
                    target["state"][j] = state_range(whole[index], offset, offset + numel, view.shape, grouped)
            part.optimizer.load_state_dict(target)


def overlap_gathers_with_forward(model: torch.nn.Module, optimizer: DataParallelOptimizer) -> None:
    """Wait for a bucket's parameter gather only where the next forward first reads its parameters:
    before the embedding, each decoder layer, the final norm and the output layer (anything else before
    the model's forward), so that the gathers of later layers overlap the compute of earlier ones. A
    unit's FP8 weights are re-quantized once its gather is in (the model-wide refresh skips weights
    whose gather is pending)."""
    from infir.model.fp8_linears import WeightRefresh, fp8_linears_of

    decoder = model.decoder
    units = [m for m in (getattr(model, "embedding", None), *decoder.layers, getattr(decoder, "final_layernorm", None),
                         getattr(model, "output_layer", None)) if m is not None]
    covered = {p for unit in units for p in unit.parameters()}
    model.register_forward_pre_hook(_gather_wait(optimizer, [p for p in model.parameters() if p not in covered], None))
    for unit in units:
        linears = fp8_linears_of(unit)
        # the unit's own refresh: one CUDA graph replay per unit where the recipe records it
        refresh = WeightRefresh(linears) if linears else None
        unit.register_forward_pre_hook(_gather_wait(optimizer, list(unit.parameters()), refresh))


def _gather_wait(optimizer: DataParallelOptimizer, params: list, refresh):
    @torch.compiler.disable  # waits on the host: eager, also where the unit's call is compiled (Module.compile)
    def hook(module, args) -> None:
        optimizer.wait_for(params)
        # whether or not this wait completed the gather: a bucket holding several units' parameters is
        # completed by the first unit's wait, and the later units' weights are as stale as its own were
        if refresh is not None:
            refresh(module, args)
    return hook
