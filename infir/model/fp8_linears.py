"""The spec's TP linears running `infir.fp8`: QKV / FC1 column-parallel, proj / FC2 row-parallel.

Each layer receives its `infir.fp8.Recipe` through megatron's ModuleSpec params (spec.layer_spec) and
calls the one FP8 linear core (`infir.fp8.fp8_linear`) with a `LinearSpec`: the recipe's operand
formats, the communication around the GEMMs, and whether wgrad adds into megatron's `main_grad`.

Weights: one `WeightCache` per layer quantizes the FP32 master weight once per optimizer step; every
micro-batch's fprop and dgrad reuse it, dgrad through the transposed view of the same 128x128 blocks.
`attach_weight_refresh` (a forward pre-hook on the model; on a GPU with block weights, one CUDA graph
replayed a step: WeightRefresh) re-quantizes every weight that changed before each forward, so a
layer reads its cache without checking it, which a compiled layer could not do; a layer without the
hook checks the cache itself, outside any compiled graph.

Sequence parallelism: megatron all-gathers the BF16 activation shards before the column-parallel
GEMM. Here, for per-token activations in 128-token shards, the local shard is quantized first and the
FP8 bytes + scales are all-gathered (`infir.fp8.SequenceParallel`: half the bytes, exact); other
formats gather BF16 as megatron does and quantize after.

BF16 autocast: the FP8 core takes BF16 activations (the autocast dtype) and FP32 master weights,
and runs with autocast off inside (its GEMMs are FP8; outputs come back in the activation dtype).

SwiGLU: where the recipe keeps SwiGLU's input in FP8, FC1 applies SwiGLU itself as the core's epilogue
and hands FC2 its input already quantized (an `Fp8SwiGLUOutput`); the MLP's activation is then the
identity (fp8_swiglu.py).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from infir.fp8 import (LOCAL, Fp8SwiGLUOutput, LinearSpec, Recipe, SequenceParallel, SequenceParallelOutput, WeightCache,
                       fp8_linear, tensors_of)
from infir.model.linears import ColumnLinear, RowLinear, column_input, sequence_reduce_scatter
from infir.model.main_grad import mark_main_grad_adds


def _activation_dtype(x):
    if isinstance(x, Fp8SwiGLUOutput):
        return x
    dev = x.device.type
    if torch.is_autocast_enabled(dev) and x.dtype == torch.float32:
        return x.to(torch.get_autocast_dtype(dev))
    return x


class Fp8Projection:
    """Mixin of the FP8 linears: the recipe, the weight cache and the call into the FP8 core."""

    # set by attach_weight_refresh: only then may the layer read its weight cache unchecked
    weight_refreshed = False
    # set by the refresh hook (mark_main_grad_adds) where the weight has megatron's FP32 main_grad: wgrad adds into it
    to_main_grad = False

    def _init_fp8(self, recipe: Recipe, swiglu_epilogue: bool) -> None:
        if not recipe.fp8:
            raise ValueError(f"{type(self).__name__} needs an FP8 recipe, not {recipe.name!r}")
        if swiglu_epilogue and recipe.swiglu_input is None:
            raise ValueError(f"recipe {recipe.name!r} keeps SwiGLU's input in the compute dtype: no SwiGLU epilogue")
        self.recipe = recipe
        self.weight_cache = WeightCache()
        self.swiglu = recipe.swiglu_input if swiglu_epilogue else None

    def fp8_matmul(self, x, weight: torch.Tensor, bias, comm=LOCAL):
        wq = self.weight_cache.q if self.weight_refreshed else self._fresh_weight(weight)
        spec = LinearSpec.of(self.recipe, wq.granularity, comm=comm, to_main_grad=self.to_main_grad,
                             swiglu=self.swiglu, fp8_out=self.swiglu is not None)
        x = _activation_dtype(x)
        with torch.autocast(weight.device.type, enabled=False):
            return fp8_linear(x, weight, wq, bias, spec)

    @torch.compiler.disable
    def _fresh_weight(self, weight: torch.Tensor):
        return self.weight_cache.get(weight, self.recipe)


class Fp8ColumnLinear(Fp8Projection, ColumnLinear):
    """Column-parallel FP8 linear (QKV, FC1). `swiglu_epilogue`: FC1 applying SwiGLU (the recipe's
    swiglu_input format) and handing FC2 its FP8 input."""

    def __init__(self, *args, recipe: Recipe, swiglu_epilogue: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fp8(recipe, swiglu_epilogue)
        tp = self.tp_group
        world = 1 if tp is None else dist.get_world_size(tp)
        # compiled code names the group by string: it holds no ProcessGroup objects
        self.sp_comm = SequenceParallel(tp.group_name, world, self.config.tp_comm_overlap) if world > 1 else None

    def _forward_impl(self, input, weight, bias=None, *, allreduce_dgrad=False, sequence_parallel=False, tp_group=None, **_):
        tokens = input.numel() // input.shape[-1]
        if sequence_parallel and self.sp_comm is not None and SequenceParallel.takes(self.recipe.input.granularity, tokens):
            return self.fp8_matmul(input, weight, bias, self.sp_comm)
        x = column_input(input, allreduce_dgrad=allreduce_dgrad, sequence_parallel=sequence_parallel, tp_group=tp_group)
        return self.fp8_matmul(x, weight, bias)


class Fp8RowLinear(Fp8Projection, RowLinear):
    """Row-parallel FP8 linear (attention output, FC2)."""

    def __init__(self, *args, recipe: Recipe, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fp8(recipe, swiglu_epilogue=False)

    def matmul(self, x, weight, bias):
        return self.fp8_matmul(x, weight, bias)

    def matmul_reduce_scatter(self, x, weight: torch.Tensor) -> torch.Tensor:
        """Split per rank around the GEMM (tp_comm_overlap, dY's shards gathered as FP8 operands in backward)
        where the recipe's gradient operands allow it (SequenceParallel.takes), else megatron's order."""
        world = self.tp_group.size()
        y = x.anchor if isinstance(x, Fp8SwiGLUOutput) else x
        tokens = y.numel() // y.shape[-1]
        if (self.config.tp_comm_overlap and world > 1 and tokens % world == 0
                and SequenceParallel.takes(self.recipe.grad_output.granularity, tokens // world)):
            return self.fp8_matmul(x, weight, None, SequenceParallelOutput(self.tp_group.group_name, world))
        return sequence_reduce_scatter(self.matmul(x, weight, None), self.tp_group)


def splits_around_gemms(recipe: Recipe, shard_tokens: int) -> bool:
    """Whether the recipe's linears can split their sequence-parallel collectives around the GEMMs
    (tp_comm_overlap) for shards of `shard_tokens` tokens: BF16 ones always; FP8 ones where activations and
    gradients are quantized per token in whole 128-token groups of a shard (SequenceParallel.takes)."""
    if recipe.input is None:
        return True
    return all(SequenceParallel.takes(f.granularity, shard_tokens) for f in (recipe.input, recipe.grad_output))


def fp8_linears_of(model: torch.nn.Module) -> list:
    return [m for m in model.modules() if isinstance(m, Fp8Projection)]


def attach_weight_refresh(model: torch.nn.Module, linears: list | None = None):
    """Before every forward of `model`, re-quantize the FP8 copy of each weight that changed
    (WeightCache's storage/version check): the layers then read their caches without checking them.

    Also, for weights with megatron's FP32 `main_grad`: wgrad adds into main_grad itself and gives
    autograd an unwritten placeholder, so the hook marks each such weight `grad_added_to_main_grad`
    for DDP's grad hook to skip it. megatron clears that mark at every zero_grad_buffer(), before the
    step's forwards. Returns the hook handle."""
    linears = fp8_linears_of(model) if linears is None else linears
    for m in linears:
        m.weight_refreshed = True
    return model.register_forward_pre_hook(WeightRefresh(linears))


def quantize_weights_per_layer(layers: list) -> None:
    """Each layer's FP8 weights quantized as its forward begins and dropped as it ends, instead of kept from
    one optimizer step to the next: one layer's FP8 weights exist at a time (and, where autograd records the
    forward, until that layer's backward has read them). Under full recomputation that is 1 byte per
    parameter less at the peak for two quantizations a micro-batch (the forward and its recompute) instead
    of one a step. The model-wide refresh must leave these linears out (attach_weight_refresh)."""
    for layer in layers:
        linears = fp8_linears_of(layer)
        if not linears:
            continue
        for m in linears:
            m.weight_refreshed = True
        before, after = _per_layer_hooks(linears)
        layer.register_forward_pre_hook(before)
        layer.register_forward_hook(after)


def _per_layer_hooks(linears: list):
    refresh = WeightRefresh(linears)

    # eager, also where the layer's call is compiled (Module.compile traces its hooks)
    @torch.compiler.disable
    def before(module, args) -> None:
        refresh(module, args)

    @torch.compiler.disable
    def after(module, args, output) -> None:
        for m in linears:
            m.weight_cache.release()
    return before, after


class WeightRefresh:
    """attach_weight_refresh's hook. After each optimizer step every weight is stale, and the
    refresh re-quantizes them all before the step's first forward, when the GPU has nothing queued:
    issued from Python, a weight at a time (a quantize kernel, two scale layouts, the copies into the
    cache's tensors), it keeps the GPU waiting on the host for small models. Where the recipe says
    weight_refresh='graph', the refresh is recorded once as a CUDA graph and replayed: one launch a
    step. Its quantizers allocate only temporaries, freed as each weight is done, so the next weight's
    reuse them in the graph's private pool. MOSS's automatic scaling (host-side bookkeeping each step)
    and CPU runs keep the eager refresh."""

    def __init__(self, linears: list):
        self.linears = linears
        self.graph: torch.cuda.CUDAGraph | None = None
        self._graph_key: tuple | None = None

    @torch.no_grad()
    def __call__(self, _module, _args) -> None:
        # A weight whose data-parallel gather is still in flight (`gather_pending`, set by a sharded
        # optimizer) is re-quantized where its layer waits for it, not here.
        pending = any(getattr(m.weight, "gather_pending", False) for m in self.linears)
        stale = [m for m in self.linears
                 if not getattr(m.weight, "gather_pending", False) and not m.weight_cache.fresh(m.weight, m.recipe)]
        # the graph re-quantizes every weight from its parameter: only where all are stale. A fresh one may hold
        # FP8 bytes no parameter here gives (the FP8 parameter gather's, beside parameters gathered in full)
        if stale and len(stale) == len(self.linears) and not pending and self._graphable():
            self._replay()
        else:
            for m in stale:
                m.weight_cache.get(m.weight, m.recipe)
        mark_main_grad_adds(self.linears)

    def _graphable(self) -> bool:
        """Every weight on a GPU, its recipe's refresh a graph, and already cached once at its present
        shape (the eager fill is also the quantizers' warm-up: no autotuning runs inside a capture; a
        weight of a new shape is refilled eagerly, into new tensors, before a graph is recorded)."""
        return bool(self.linears) and all(
            m.weight.is_cuda and m.recipe.weight_refresh == "graph" and m.weight_cache.q is not None
            and m.weight_cache.q.data.shape == m.weight.shape for m in self.linears)

    def _replay(self) -> None:
        # the addresses the graph reads and writes: a weight or cache tensor moved means a new recording
        key = tuple((m.weight.data_ptr(), *(t.data_ptr() for t in tensors_of(m.weight_cache.q) if t is not None))
                    for m in self.linears)
        if key != self._graph_key:
            self.graph, self._graph_key = None, None
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA calls (a data loader's copies) do not break the capture
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                for m in self.linears:
                    m.weight_cache.refill(m.weight, m.recipe)
            self.graph, self._graph_key = graph, key
        self.graph.replay()
        for m in self.linears:
            m.weight_cache.mark_fresh(m.weight, m.recipe)
