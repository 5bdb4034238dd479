"""The spec's TP linears running `infir.fp8` (issue 11): QKV / FC1 column-parallel, proj / FC2 row-parallel.

Weights: one `WeightCache` per layer quantizes the FP32 master weight once per optimizer step (the
trainer calls `step(lr)` after each update); every micro-batch's fprop and dgrad reuse it, dgrad
through the transposed view of the same 128x128 blocks.

Sequence parallelism: megatron all-gathers the BF16 activation shards before the column-parallel
GEMM. Here the local shard is quantized first and the FP8 bytes + scales are all-gathered (half the
bytes; the saved wgrad operand stays FP8). This equals quantize-after-gather exactly when no
quantization group straddles two shards: per-token 1x128 groups never do along K, and the 128-token
groups of the wgrad operand X^T line up when each shard holds a multiple of 128 tokens; per-tensor
scales use the amax all-reduced over the TP group first. Where that does not hold (MOSS two-level
groups, unaligned shards) the layer gathers BF16 and quantizes after, as megatron would.

BF16 autocast: the FP8 function takes BF16 activations (the autocast dtype) and FP32 master weights,
and runs with autocast off inside (its GEMMs are FP8; outputs come back in the activation dtype).

torch.compile: inside a compiled layer the linear runs `infir.fp8.traced` (its quantizers and GEMMs as
custom ops over the same Triton kernels and scaled_mm), so the layer stays one graph and the host
issues it from generated code; launched from Python between graph breaks, the
eager path made the 1.5B FP8 step host-bound (the GPU waited on the CPU). The traced path cannot look
after the weight cache, so `attach_weight_refresh` (a forward pre-hook on the model; on a GPU, one CUDA
graph replayed a step: WeightRefresh) re-quantizes any weight that changed before each forward; a
linear without that hook keeps the eager path even when compiled, so it never reads a stale FP8
weight. The sequence-parallel FP8 all-gather of per-token activations (the blockwise recipes) is
traced too, as functional collectives inside the graph; eager callers, the FP8 health monitor's
steps and the per-tensor recipe's gather (its amax all-reduce) keep the Triton path, outside the graph.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

from infir.fp8 import WeightCache, get_recipe
from infir.fp8 import linear as fp8_linear
from infir.fp8.formats import get_format
from infir.fp8.gemm import fp8_gemm
from infir.fp8.linear import _tensors, fp8_backward, quantize_operand
from infir.fp8.formats import scale_from_amax
from infir.fp8.quantize import QTensor
from infir.fp8.swiglu import swiglu_fp8_input
from infir.fp8.traced import Fp8SwiGLUOutput, traced_linear
from infir.model.linears import ColumnLinear, RowLinear, column_input


def _activation_dtype(x: torch.Tensor) -> torch.Tensor:
    dev = x.device.type
    if torch.is_autocast_enabled(dev) and x.dtype == torch.float32:
        return x.to(torch.get_autocast_dtype(dev))
    return x


class _Fp8(object):
    """Mixin: the recipe, the weight cache and the health-monitor hook of one FP8 linear."""

    recipe_name = "fp8_blockwise_ue8m0"
    monitor = None  # an infir.train.fp8_health.HealthMonitor, set by the trainer
    # set by attach_weight_refresh: only then may the compiled path read the weight cache unchecked
    weight_refreshed = False
    # set by attach_weight_refresh where the weight has megatron's main_grad: the traced wgrad adds into it
    to_main_grad = False
    # (scale_format, fmt) where this linear is a gated FC1 that applies SwiGLU itself (fp8_linear_classes)
    swiglu: tuple[str, str] | None = None

    def _init_fp8(self):
        self.fp8_recipe = get_recipe(self.recipe_name)
        self.weight_cache = WeightCache(name="")

    def traceable(self) -> bool:
        """Inside a compiled layer, with the weight cache kept fresh and no health-monitor step."""
        return (torch.compiler.is_compiling() and self.weight_refreshed
                and not (self.monitor is not None and self.monitor.active))

    def traced_matmul(self, x, weight, bias, sp_group: str | None = None, sp_size: int = 1):
        # FC1 with SwiGLU hands y to FC2 in FP8 (traced.Fp8SwiGLUOutput), where FC2 is traced too: both
        # are, inside the compiled layer, under the same conditions (traceable)
        if not isinstance(x, Fp8SwiGLUOutput):
            x = _activation_dtype(x)
        with torch.autocast(weight.device.type, enabled=False):
            return traced_linear(x, weight, self.weight_cache.q, bias, self.fp8_recipe, sp_group, sp_size,
                                 self.to_main_grad, self.swiglu, fp8_out=self.swiglu is not None)

    def fp8_matmul(self, x, weight, bias):
        if self.traceable():
            return self.traced_matmul(x, weight, bias)
        if isinstance(x, Fp8SwiGLUOutput):
            raise RuntimeError(f"{type(self).__name__} got FC1's FP8 SwiGLU output outside a compiled layer: FC1 and "
                               "FC2 must both run traced (the same recipe, weight refresh and health-monitor state)")
        return self._fp8_matmul_eager(x, weight, bias)

    @torch.compiler.disable
    def _fp8_matmul_eager(self, x, weight, bias):
        x = _activation_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            y = fp8_linear(x, weight, bias, self.fp8_recipe, weight_cache=self.weight_cache)
        if self.monitor is not None and self.monitor.active:
            self.monitor.record(self, x, weight, y)
        return self._activation(y)

    def _activation(self, h):
        """The eager paths' SwiGLU, unfused (the traced path fuses it into the linear)."""
        return h if self.swiglu is None else swiglu_fp8_input(h, *self.swiglu)


class Fp8ColumnLinear(_Fp8, ColumnLinear):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fp8()
        # The traced gather names its group by string: compiled code does not hold ProcessGroup objects.
        tp = self.tp_group
        self.sp_size = 1 if tp is None else dist.get_world_size(tp)
        self.sp_group_name = tp.group_name if self.sp_size > 1 else None

    def _forward_impl(self, input, weight, bias=None, *, allreduce_dgrad=False, sequence_parallel=False, tp_group=None, **_):
        if sequence_parallel and fp8_gather_supported(self.fp8_recipe, input, tp_group):
            if self.fp8_recipe.activation == "token" and self.sp_group_name is not None and self.traceable():
                return self.traced_matmul(input, weight, bias, self.sp_group_name, self.sp_size)
            return self._gathered_fp8(input, weight, bias, tp_group)
        x = column_input(input, allreduce_dgrad=allreduce_dgrad, sequence_parallel=sequence_parallel, tp_group=tp_group)
        return self.fp8_matmul(x, weight, bias)

    @torch.compiler.disable
    def _gathered_fp8(self, input, weight, bias, tp_group):
        x = _activation_dtype(input)
        with torch.autocast(x.device.type, enabled=False):
            y = Fp8GatheredColumn.apply(x, weight, bias, self.fp8_recipe, self.weight_cache, tp_group)
        if self.monitor is not None and self.monitor.active:
            self.monitor.record(self, gather_from_sequence_parallel_region(x.detach(), group=tp_group), weight, y)
        return self._activation(y)


class Fp8RowLinear(_Fp8, RowLinear):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fp8()

    def matmul(self, x, weight, bias):
        return self.fp8_matmul(x, weight, bias)


def fp8_linears_of(model: torch.nn.Module) -> list:
    return [m for m in model.modules() if isinstance(m, _Fp8)]


def attach_weight_refresh(model: torch.nn.Module, linears: list | None = None):
    """Before every forward of `model`, re-quantize the FP8 copy of each weight that changed
    (WeightCache's storage/version check): compiled layers read the caches without checking them.

    Also, for weights with megatron's FP32 `main_grad`: the compiled wgrad adds into main_grad itself
    (traced.fp8_wgrad_main_grad; the eager path does too, and gives autograd no dW), so the hook marks
    each such weight `grad_added_to_main_grad` for DDP's grad hook to skip the placeholder autograd
    gets. megatron clears that mark at every zero_grad_buffer(), before the step's forwards.
    Returns the hook handle."""
    linears = fp8_linears_of(model) if linears is None else linears
    for m in linears:
        m.weight_refreshed = True
    return model.register_forward_pre_hook(WeightRefresh(linears))


class WeightRefresh:
    """attach_weight_refresh's hook. After each optimizer step every weight is stale, and the
    refresh re-quantizes them all before the step's first forward, when the GPU has nothing queued:
    issued from Python, a weight at a time (a quantize kernel, two scale layouts, the copies into the
    cache's tensors), it kept the GPU waiting: at Qwen2.5-0.5B's 96 linears the first micro-batch took
    95 ms, the second and third 67.5-69.3 (bench/step_phases.py, BENCHMARKS.md). Where every weight is
    quantized per 128x128 block on a GPU, the refresh is recorded once as a CUDA graph and replayed:
    one launch a step. Its quantizers allocate only temporaries, freed as each weight is done, so the
    next weight's reuse them in the graph's private pool. MOSS's automatic scaling (host-side
    bookkeeping each step) and CPU runs keep the eager refresh."""

    def __init__(self, linears: list):
        self.linears = linears
        self.graph: torch.cuda.CUDAGraph | None = None
        self._graph_key: tuple | None = None

    @torch.no_grad()
    def __call__(self, _module, _args) -> None:
        stale = [m for m in self.linears if not m.weight_cache.fresh(m.weight, m.fp8_recipe)]
        if stale and self._graphable():
            self._replay()
        else:
            for m in stale:
                m.weight_cache.get(m.weight, m.fp8_recipe)
        for m in self.linears:
            m.to_main_grad = hasattr(m.weight, "main_grad")
            if m.to_main_grad:
                m.weight.grad_added_to_main_grad = True

    def _graphable(self) -> bool:
        """Every weight on a GPU, quantized per block, and already cached once at its present shape
        (the eager fill is also the quantizers' warm-up: no autotuning runs inside a capture; a
        weight of a new shape is refilled eagerly, into new tensors, before a graph is recorded)."""
        return bool(self.linears) and all(
            m.weight.is_cuda and m.fp8_recipe.weight == "block" and m.weight_cache.q is not None
            and m.weight_cache.q.data.shape == m.weight.shape for m in self.linears)

    def _replay(self) -> None:
        # the addresses the graph reads and writes: a weight or cache tensor moved means a new recording
        key = tuple((m.weight.data_ptr(), *(t.data_ptr() for t in _tensors(m.weight_cache.q) if t is not None))
                    for m in self.linears)
        if key != self._graph_key:
            self.graph, self._graph_key = None, None
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA calls (a data loader's copies) do not break the capture
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                for m in self.linears:
                    m.weight_cache.refill(m.weight, m.fp8_recipe)
            self.graph, self._graph_key = graph, key
        self.graph.replay()
        for m in self.linears:
            m.weight_cache.mark_fresh(m.weight, m.fp8_recipe)


def fp8_gather_supported(recipe, x: torch.Tensor, tp_group) -> bool:
    """FP8 all-gather is exact for per-token and per-tensor activations when 128-token groups align."""
    if recipe.activation == "two_level":
        return False
    tokens_local = x.numel() // x.shape[-1]
    return recipe.activation == "tensor" or tokens_local % 128 == 0


def _all_gather_q(q: QTensor, dim: int, group) -> QTensor:
    """Concatenate every rank's FP8 shard (bytes and scales) along `dim`, in rank order."""
    world = dist.get_world_size(group)
    data = q.data.view(torch.uint8).contiguous()
    parts = [torch.empty_like(data) for _ in range(world)]
    dist.all_gather(parts, data, group=group)
    gathered = torch.cat(parts, dim=dim).view(q.data.dtype)
    if q.granularity == "tensor":
        scale = q.scale  # one scale, the same on every rank (from the all-reduced amax)
    else:
        scale = q.scale.contiguous()
        sparts = [torch.empty_like(scale) for _ in range(world)]
        dist.all_gather(sparts, scale, group=group)
        scale = torch.cat(sparts, dim=dim)
    return QTensor(gathered, scale, q.granularity, q.scale_format, q.fmt)


def _quantize_shard(x2: torch.Tensor, recipe, group, rows: bool, cols: bool):
    if recipe.activation != "tensor":
        return quantize_operand(x2, recipe.activation, recipe, rows=rows, cols=cols)
    # Per-tensor: one scale for the whole (gathered) tensor, from the amax over all shards.
    from infir.fp8.formats import amax_with_nan_as_inf

    amax = amax_with_nan_as_inf(x2).float().reshape(1)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    scale = scale_from_amax(amax[0], get_format(recipe.fmt), recipe.scale_format)
    if x2.is_cuda:
        from infir.fp8.kernels import quantize_tensor_triton

        q, qt = quantize_tensor_triton(x2, recipe.scale_format, recipe.fmt, scale=scale, transpose=cols)
        return (q if rows else None), qt
    from infir.fp8.quantize import quantize_tensor_ref

    q = quantize_tensor_ref(x2, get_format(recipe.fmt), recipe.scale_format, scale=scale)
    return (q if rows else None), (q.t() if cols else None)


class Fp8GatheredColumn(torch.autograd.Function):
    """Column-parallel FP8 linear whose sequence-parallel all-gather moves FP8 bytes + scales.

    fprop  Y = gather(Q(X_local)) W^T        dgrad dX_local = reduce_scatter(dY W)
    wgrad  dW = Q(dY)^T gather(Q(X_local)^T)  (FP32 into megatron's main_grad when present)
    """

    @staticmethod
    def forward(ctx, x, weight, bias, recipe, cache: WeightCache, group):
        need_wgrad = ctx.needs_input_grad[1]
        k = x.shape[-1]
        qx, qxt = _quantize_shard(x.reshape(-1, k), recipe, group, rows=True, cols=need_wgrad)
        qx = _all_gather_q(qx, 0, group)
        ctx.qxt = _all_gather_q(qxt, 1, group) if need_wgrad else None
        qw = cache.get(weight, recipe)
        y = fp8_gemm(qx, qw, out_dtype=x.dtype)
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.recipe, ctx.group, ctx.backend = recipe, group, "auto"
        ctx.qw = qw if ctx.needs_input_grad[0] else None
        ctx.x_shape, ctx.x_dtype, ctx.has_bias = x.shape, x.dtype, bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.save_for_backward(weight)
        world = dist.get_world_size(group)
        return y.reshape(x.shape[0] * world, *x.shape[1:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        full, dw, db = fp8_backward(ctx, dy)
        dx = None
        if full is not None:  # this rank's partial dX of the whole sequence -> summed, scattered back
            dx = torch.empty((full.shape[0] // dist.get_world_size(ctx.group), full.shape[1]), dtype=full.dtype, device=full.device)
            dist.reduce_scatter_tensor(dx, full.contiguous(), group=ctx.group)
            dx = dx.reshape(ctx.x_shape)
        return dx, dw, db, None, None, None


def fp8_linear_classes(recipe_name: str, swiglu: tuple[str, str] | None = None):
    """Column/row classes bound to one recipe (megatron's ModuleSpec takes classes, not instances).

    swiglu: (scale_format, fmt) of SwiGLU's FP8-saved input; FC1 then gets its own class, which applies
    SwiGLU itself (the MLP's activation must then be the identity): inside a compiled layer its
    backward goes from dY straight to FC1's FP8 gradient operands (traced.traced_linear)."""
    from infir.model.spec import LinearClasses

    column = type(f"Fp8ColumnLinear_{recipe_name}", (Fp8ColumnLinear,), {"recipe_name": recipe_name})
    row = type(f"Fp8RowLinear_{recipe_name}", (Fp8RowLinear,), {"recipe_name": recipe_name})
    fc1 = None
    if swiglu is not None:
        fc1 = type(f"Fp8SwiGLUColumnLinear_{recipe_name}", (column,), {"swiglu": tuple(swiglu)})
    return LinearClasses(column=column, row=row, fc1=fc1)
