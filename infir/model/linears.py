"""megatron's tensor-parallel linears with the matmul as an ordinary autograd op that a recipe can swap.

megatron's ColumnParallelLinear / RowParallelLinear route their matmul through `_forward_impl`, by
default a custom autograd Function (LinearWithGradAccumulationAndAsyncCommunication) that (a)
re-enters autocast in backward for CUDA only, so BF16 autocast breaks on CPU, (b) is opaque to
torch.compile's fusion, and (c) hard-wires a BF16 GEMM. We keep megatron's modules (parameters,
initialisation, TP sharding, checkpoint keys) and override `_forward_impl` (the tensor-parallel
communication on the input side, then `self.matmul`) and, under sequence parallelism, the row-parallel
`forward` (its output's reduce-scatter, below).

Communication:
- sequence parallel: the column-parallel input is all-gathered from the sequence shards (backward:
  reduce-scatter of dgrad) and the row-parallel output reduce-scattered back to them (backward:
  all-gather), both through functional collectives (`sequence_gather`, `sequence_reduce_scatter`);
- tensor parallel without SP: megatron's mappings (identity, backward all-reduce of dgrad; the row
  output's all-reduce in RowParallelLinear.forward).
With `tp_comm_overlap` (megatron's TransformerConfig field, otherwise read only by Transformer Engine's
layers) the sequence-parallel collectives are split per rank around the GEMMs (infir.fp8.sp_overlap):
the column-parallel input's gather around the fprop GEMM, the row-parallel output's reduce-scatter around
it, dY's gather around the row-parallel dgrad, dX's reduce-scatter around the column-parallel dgrad and
X's gather around its wgrad. The split schedules run inside opaque graph ops, so that a compiled layer
keeps their order (each GEMM between its rows' arrival and the next transfer) and their writes into rows
of one output.
Weight gradients: where megatron's DDP holds an FP32 `main_grad` for the weight (`to_main_grad`, set before each
forward by mark_main_grad_adds), the backward's wgrad GEMM adds into it in its epilogue (main_grad.add_product)
and hands autograd an unwritten placeholder, which DDP's hook skips: megatron's gradient_accumulation_fusion,
which needs apex. Returned instead, the BF16 dW would be cast to FP32 and added by the hook, three more passes
over every weight's gradient a micro-batch.
Why not megatron's SP mappings: they write into a preallocated output with the in-place c10d calls, and
inside a torch.compile'd layer on NCCL the gradients that came out of their backward were wrong (TP=2 with
SP trained at a 17x smaller gradient norm than one rank, on the same first loss; launch/parallel_check.py).
Out-of-place functional collectives are what dynamo traces as they run, as infir.fp8.comm does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region

from infir.fp8.oplib import define_op
from infir.fp8.sp_overlap import gather_mm, mm_reduce_scatter, reserve, shares_memory
from infir.model.main_grad import add_product, mark_main_grad_adds


def _all_gather(x: torch.Tensor, group: str, world: int) -> torch.Tensor:
    out = torch.ops._c10d_functional.all_gather_into_tensor(x.contiguous(), world, group)
    return torch.ops._c10d_functional.wait_tensor(out)


def _reduce_scatter(x: torch.Tensor, group: str, world: int) -> torch.Tensor:
    out = torch.ops._c10d_functional.reduce_scatter_tensor(x.contiguous(), "sum", world, group)
    return torch.ops._c10d_functional.wait_tensor(out)


class _SequenceCollective(torch.autograd.Function):
    """gather=True: the concatenation (dim 0) of every rank's sequence shard, whose gradient is reduce-scattered;
    gather=False: this rank's shard of the sum over ranks (reduce-scatter), whose gradient is all-gathered."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gather: bool, group: str, world: int) -> torch.Tensor:
        ctx.gather, ctx.group, ctx.world = gather, group, world
        return (_all_gather if gather else _reduce_scatter)(x, group, world)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (_reduce_scatter if ctx.gather else _all_gather)(grad, ctx.group, ctx.world), None, None, None


def sequence_gather(x: torch.Tensor, tp_group) -> torch.Tensor:
    world = tp_group.size()
    return x if world == 1 else _SequenceCollective.apply(x, True, tp_group.group_name, world)


def sequence_reduce_scatter(x: torch.Tensor, tp_group) -> torch.Tensor:
    world = tp_group.size()
    return x if world == 1 else _SequenceCollective.apply(x, False, tp_group.group_name, world)


def _bf16_gather_linear(x: torch.Tensor, w: torch.Tensor, transposed: bool, keep: bool, group: str, world: int):
    """(every rank's x rows, in rank order) @ w^T (w [N, K]; with `transposed`, @ w, w [K, N]), the
    gather split per rank around the GEMMs; and, with `keep`, the gathered x itself (else an empty tensor)."""
    m = x.shape[0]
    b = w if transposed else w.t()
    out = x.new_empty((m * world, b.shape[1]))
    everyone = gather_mm([x], lambda j, t: torch.mm(t[0], b, out=out[j * m:(j + 1) * m]), group)
    return out, (torch.cat([t[0] for t in everyone]) if keep else x.new_empty(0))


def _bf16_gather_linear_fake(x, w, transposed, keep, group, world):
    n = w.shape[1 if transposed else 0]
    return x.new_empty((x.shape[0] * world, n)), (x.new_empty((x.shape[0] * world, x.shape[1])) if keep else x.new_empty(0))


_gather_linear = define_op("sp_gather_linear", "(Tensor x, Tensor w, bool transposed, bool keep, str group, int world) "
                           "-> (Tensor, Tensor)", _bf16_gather_linear, _bf16_gather_linear_fake)


def _bf16_linear_reduce_scatter(x: torch.Tensor, w: torch.Tensor, group: str, world: int) -> torch.Tensor:
    m = x.shape[0] // world
    return mm_reduce_scatter(lambda j: x[j * m:(j + 1) * m] @ w.t(), group)


_linear_reduce_scatter = define_op(
    "sp_linear_reduce_scatter", "(Tensor x, Tensor w, str group, int world) -> Tensor", _bf16_linear_reduce_scatter,
    lambda x, w, group, world: x.new_empty((x.shape[0] // world, w.shape[0])))


def _bf16_gather_wgrad(x: torch.Tensor, dy: torch.Tensor, weight: torch.Tensor | None, group: str,
                       world: int) -> torch.Tensor:
    """dW = dY^T @ (every rank's x rows, in rank order), x's gather split per rank around the GEMMs: each
    rank's rows multiplied by dY's rows of its tokens as they land, each product added by the GEMM's own
    epilogue. With `weight`: added into its FP32 main_grad, and an unwritten placeholder returned (as
    wgrad_main_grad); else dW in dY's dtype (addmm sums in FP32 and rounds once a product: a dW rounded W
    times instead of once, against an FP32 buffer's zeroing, adds and cast, passes over the whole weight's
    FP32 gradient that cost more than the overlap hid, bench/step.py's tp-overlap cases)."""
    m = x.shape[0]
    acc: list[torch.Tensor] = [] if weight is None else [weight.main_grad]

    def mm(j: int, t) -> None:
        dy_j = dy[j * m:(j + 1) * m].t()
        if weight is not None:
            add_product(acc[0], dy_j, t[0])
        elif acc:
            acc[0].addmm_(dy_j, t[0])
        else:
            acc.append(dy_j @ t[0])

    gather_mm([x], mm, group)
    return acc[0] if weight is None else torch.empty_like(weight)


_gather_wgrad = define_op(
    "sp_gather_wgrad", "(Tensor x, Tensor dy, Tensor? weight, str group, int world) -> Tensor", _bf16_gather_wgrad,
    lambda x, dy, weight, group, world: dy.new_empty((dy.shape[1], x.shape[1])) if weight is None
    else torch.empty_like(weight))


def _wgrad_main_grad(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight.main_grad += dY^T @ X (add_product), and an unwritten placeholder of the weight's shape for
    autograd, which megatron's grad hook skips (grad_added_to_main_grad). main_grad is reached through the
    weight, as infir.fp8's fp8_wgrad_main_grad does it: a parameter is a static input of a CUDA graph, so the
    captured GEMM writes the real buffer."""
    add_product(weight.main_grad, dy.t(), x)
    return torch.empty_like(weight)


_wgrad_into_main_grad = define_op("wgrad_main_grad", "(Tensor dy, Tensor x, Tensor weight) -> Tensor", _wgrad_main_grad,
                                  lambda dy, x, weight: torch.empty_like(weight))


def _weight_grad(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, into_main_grad: bool) -> torch.Tensor:
    """The gradient autograd gets for the master `weight` of y = x @ W^T (dy, x: 2-D): added into its main_grad
    (a placeholder comes back), else dY^T @ X in the weight's dtype."""
    if into_main_grad:
        return _wgrad_into_main_grad(dy, x, weight)
    return (dy.t() @ x).to(weight.dtype)


class _Linear(torch.autograd.Function):
    """y = x @ W^T (+ b) in x's dtype, from the master weight (cast here, as autocast would), whose gradient
    the backward adds into main_grad."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        w = weight.to(x.dtype)
        ctx.save_for_backward(x, w, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, w, bias)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w, weight = ctx.saved_tensors
        dx = dy @ w if ctx.needs_input_grad[0] else None
        dy2 = dy.reshape(-1, dy.shape[-1])
        dw = _wgrad_into_main_grad(dy2, x.reshape(-1, x.shape[-1]), weight) if ctx.needs_input_grad[1] else None
        return dx, dw, dy2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, into_main_grad: bool) -> torch.Tensor:
    """F.linear as autocast runs it (in the autocast dtype where it is on); into_main_grad: the weight's
    gradient added into its FP32 main_grad by the backward's GEMM (module docstring)."""
    if not into_main_grad:
        return F.linear(x, weight, bias)
    dev = x.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    with torch.autocast(dev, enabled=False):
        return _Linear.apply(x.to(dtype), weight, None if bias is None else bias.to(dtype))


class _OverlappedColumn(torch.autograd.Function):
    """y = gather(x) @ W^T over the sequence shards, the gather split per rank around the GEMM; in backward
    dX's reduce-scatter split per rank around dgrad and x's gather around wgrad. W in x's dtype from the
    master weight; into_main_grad: wgrad adds into its main_grad."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, into_main_grad: bool, group: str, world: int):
        w = weight.to(x.dtype)
        ctx.save_for_backward(x, w, weight)
        ctx.into_main_grad, ctx.group, ctx.world = into_main_grad, group, world
        return _gather_linear(x, w, False, False, group, world)[0]

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = _linear_reduce_scatter(dy, w.t(), ctx.group, ctx.world)  # dY @ W, one destination's rows at a time
        dw = _gather_wgrad(x.contiguous(), dy, weight if ctx.into_main_grad else None, ctx.group, ctx.world)
        return dx, dw if ctx.into_main_grad else dw.to(weight.dtype), None, None, None


class _OverlappedRow(torch.autograd.Function):
    """y = this rank's rows of sum over ranks of x @ W^T, the reduce-scatter split per rank around the GEMM
    (W and into_main_grad as _OverlappedColumn)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, into_main_grad: bool, group: str, world: int):
        w = weight.to(x.dtype)
        ctx.save_for_backward(x, w, weight)
        ctx.into_main_grad, ctx.group, ctx.world = into_main_grad, group, world
        return _linear_reduce_scatter(x, w, group, world)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w, weight = ctx.saved_tensors
        dx, dy_full = _gather_linear(dy.contiguous(), w, True, True, ctx.group, ctx.world)
        return dx, _weight_grad(dy_full, x, weight, ctx.into_main_grad), None, None, None


def overlapped_linear(x: torch.Tensor, weight: torch.Tensor, tp_group, column: bool,
                      into_main_grad: bool) -> torch.Tensor:
    """x @ weight^T of a sequence-parallel linear with its collective split per rank around the GEMM:
    column-parallel (x this rank's sequence shard, the output every token) or row-parallel (x every token
    of this rank's K-shard, the output this rank's shard of the sum). In x's dtype, as autocast would run it;
    into_main_grad: the weight's gradient added into its FP32 main_grad."""
    fn = _OverlappedColumn if column else _OverlappedRow
    with torch.autocast(x.device.type, enabled=False):
        y = fn.apply(x.reshape(-1, x.shape[-1]), weight, into_main_grad, tp_group.group_name, tp_group.size())
    return y.reshape(-1, *x.shape[1:-1], weight.shape[0])


class MainGradMarks:
    """A forward pre-hook: mark_main_grad_adds over `linears` before each forward of the module it is on (one
    outside the compiled layers)."""

    def __init__(self, linears: list):
        self.linears = linears

    def __call__(self, _module, _args) -> None:
        mark_main_grad_adds(self.linears)


def reserve_overlap_buffers(tp_group, tokens: int, hidden: int, dtype: torch.dtype, device: torch.device) -> None:
    """Maps the buffers the split schedules move rows through between GPUs of one host (sp_overlap.reserve),
    before any compiled layer runs, for micro-batches of `tokens` tokens on this tensor-parallel group. Every
    collective of a layer moves [tokens / W, hidden] rows: a reduce-scatter holds one slot of partials
    (in `dtype`) per rank; the largest gather (an FP8 dY and dY^T with their 1x128 scales) about two FP8
    copies, fewer bytes at W >= 2 than the reduce-scatter's slots in a 16-bit or wider dtype."""
    world = tp_group.size()
    if world == 1 or not shares_memory(tp_group.group_name):
        return
    rows = tokens // world * hidden
    slots = world * (rows * dtype.itemsize + 256)
    gather = 2 * (rows + rows // 32) + 1024
    reserve(tp_group.group_name, max(slots, gather), device)


def sequence_parallel_schedule(sequence_parallel: bool, overlap: bool, splits: bool, tp_group) -> str | None:
    """How this tensor-parallel group runs its sequence-parallel collectives, for the trainer's start line (None
    where there are none): with tp_comm_overlap, split around the GEMMs where the linears can (`splits`)."""
    if tp_group.size() == 1 or not sequence_parallel:
        return None
    if not overlap:
        return "sequence-parallel collectives before and after their GEMMs (parallel.tp_comm_overlap=false)"
    if not splits:
        return ("sequence-parallel collectives before and after their GEMMs: parallel.tp_comm_overlap splits FP8 ones "
                "only where activations and gradients are scaled per token, in whole 128-token groups of a rank's shard")
    how = "the copy engines (symmetric memory)" if shares_memory(tp_group.group_name) else "all-to-all exchanges"
    return f"sequence-parallel collectives split per rank around their GEMMs, rows moved by {how}"


def column_input(x: torch.Tensor, *, allreduce_dgrad: bool, sequence_parallel: bool, tp_group) -> torch.Tensor:
    if sequence_parallel:
        return sequence_gather(x, tp_group)
    if allreduce_dgrad:
        return copy_to_tensor_model_parallel_region(x, group=tp_group)
    return x


class ColumnLinear(ColumnParallelLinear):
    """Column-parallel linear (QKV, FC1): Y_i = X W_i^T on each TP rank."""

    # set before each forward by mark_main_grad_adds where the weight has megatron's FP32 main_grad
    to_main_grad = False

    def _forward_impl(self, input, weight, bias=None, *, allreduce_dgrad=False, sequence_parallel=False, tp_group=None, **_):
        if sequence_parallel and self.config.tp_comm_overlap and tp_group.size() > 1:
            y = overlapped_linear(input, weight, tp_group, True, self.to_main_grad)
            return y if bias is None else y + bias.to(y.dtype)
        x = column_input(input, allreduce_dgrad=allreduce_dgrad, sequence_parallel=sequence_parallel, tp_group=tp_group)
        return self.matmul(x, weight, bias)

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return linear(x, weight, bias, self.to_main_grad)


class RowLinear(RowParallelLinear):
    """Row-parallel linear (attention out, FC2): partial sums, reduced by megatron's forward, or under
    sequence parallelism reduce-scattered here."""

    to_main_grad = False  # as ColumnLinear's

    def forward(self, input_):
        if not self.sequence_parallel or self.explicit_expert_comm:
            return super().forward(input_)
        out = self.matmul_reduce_scatter(input_, self.weight)
        if self.skip_bias_add or self.bias is None:
            return out, self.bias if self.skip_bias_add else None
        return out + self.bias, None

    def _forward_impl(self, input, weight, bias=None, **_):
        return self.matmul(input, weight, bias)

    def matmul_reduce_scatter(self, x, weight: torch.Tensor) -> torch.Tensor:
        """x @ weight^T reduce-scattered over the sequence: split per rank around the GEMM
        (tp_comm_overlap), or the GEMM, then the collective."""
        if self.config.tp_comm_overlap and self.tp_group.size() > 1:
            return overlapped_linear(x, weight, self.tp_group, False, self.to_main_grad)
        return sequence_reduce_scatter(self._forward_impl(x, weight), self.tp_group)

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return linear(x, weight, bias, self.to_main_grad)
