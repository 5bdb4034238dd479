"""The high-precision (BF16) projections' sequence-parallel communication pipelined with their GEMMs
(parallel.tp_comm_overlap), as infir.fp8's core does for the FP8 ones, with the same pipelines
(infir.fp8.comm.SequenceParallel.gather_consume / produce_scatter):

- column-parallel (QKV, FC1): Y = gather(X) W^T, each rank's rows multiplied into their block of Y as they
  arrive, this rank's own first; backward re-gathers X for wgrad while dgrad runs and reduce-scatters dX
  while wgrad runs (megatron's order, whose gather and reduce-scatter are otherwise exposed).
- row-parallel (proj, FC2): Y's partial sums reduce-scattered with the other ranks' rows multiplied and
  sent first; backward gathers dY pipelined with dgrad, then wgrad over the whole sequence.

Each pipeline is one opaque graph op (infir.fp8.oplib), so a compiled layer keeps it as written; the
autograd Functions run them in the autocast dtype, as megatron's linear does under autocast.
"""
from __future__ import annotations

import torch

from infir.fp8 import SequenceParallel
from infir.fp8.oplib import define_op


def _gather_mm_whole(a: torch.Tensor, b: torch.Tensor, group: str, world: int, rank: int) -> tuple:
    """gather(A) @ B for this rank's rows A [M, K] and B [K, N], pipelined (SequenceParallel.gather_consume),
    and gather(A) itself (for a wgrad after it)."""
    m = a.shape[0]
    c = a.new_empty((m * world, b.shape[1]))
    (whole,) = SequenceParallel(group, world, rank, overlap=True).gather_consume(
        (a,), lambda blocks, r: torch.mm(blocks[0], b, out=c[r * m:(r + 1) * m]))
    return c, whole


gather_mm_whole = define_op(
    "gather_mm_whole", "(Tensor a, Tensor b, str group, int world, int rank) -> (Tensor, Tensor)", _gather_mm_whole,
    lambda a, b, group, world, rank: (a.new_empty((a.shape[0] * world, b.shape[1])), a.new_empty((a.shape[0] * world, a.shape[1]))))


def _mm_scatter(a: torch.Tensor, b: torch.Tensor, group: str, world: int, rank: int) -> torch.Tensor:
    """This rank's rows of (A @ B) summed over the group, for A [world * M, K], pipelined
    (SequenceParallel.produce_scatter)."""
    rows = a.shape[0] // world
    return SequenceParallel(group, world, rank, overlap=True).produce_scatter(
        lambda r, out: torch.mm(a[r * rows:(r + 1) * rows], b, out=out), rows, b.shape[1], a)


mm_scatter = define_op("mm_scatter", "(Tensor a, Tensor b, str group, int world, int rank) -> Tensor", _mm_scatter,
                       lambda a, b, group, world, rank: a.new_empty((a.shape[0] // world, b.shape[1])))


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def _args(sp: SequenceParallel) -> tuple:
    return sp.group, sp.world, sp.rank


class GatherLinear(torch.autograd.Function):
    """Y [world * S, ..., N] = gather(X) W^T for this rank's X [S, ..., K] (column-parallel under SP)."""

    @staticmethod
    def forward(ctx, x, weight, sp: SequenceParallel):
        dtype = _compute_dtype(x)
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            y, _ = gather_mm_whole(x2, weight.to(dtype).t(), *_args(sp))
        ctx.save_for_backward(x2, weight)
        ctx.sp, ctx.x_shape, ctx.x_dtype = sp, x.shape, x.dtype
        return y.view(x.shape[0] * sp.world, *x.shape[1:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        sp = ctx.sp
        dy2 = dy.reshape(-1, dy.shape[-1]).to(x2.dtype)
        with torch.autocast(dy.device.type, enabled=False):
            pending = sp.gather_start((x2,), 0)
            dx = sp.reduce_scatter_start(dy2 @ weight.to(x2.dtype))
            (x_all,) = sp.gather_wait(pending)
            dw = (dy2.t() @ x_all).to(weight.dtype)
            dx = sp.reduce_scatter_wait(dx)
        return dx.view(ctx.x_shape).to(ctx.x_dtype), dw, None


class LinearScatter(torch.autograd.Function):
    """Y [S, ..., N]: this rank's shard of sum over ranks of X W^T, for X [world * S, ..., K] (row-parallel
    under SP)."""

    @staticmethod
    def forward(ctx, x, weight, sp: SequenceParallel):
        dtype = _compute_dtype(x)
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            y = mm_scatter(x2, weight.to(dtype).t(), *_args(sp))
        ctx.save_for_backward(x2, weight)
        ctx.sp, ctx.x_shape, ctx.x_dtype = sp, x.shape, x.dtype
        return y.view(x.shape[0] // sp.world, *x.shape[1:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1]).to(x2.dtype)
        with torch.autocast(dy.device.type, enabled=False):
            dx, dy_all = gather_mm_whole(dy2, weight.to(x2.dtype), *_args(ctx.sp))
            dw = (dy_all.t() @ x2).to(weight.dtype)
        return dx.view(ctx.x_shape).to(ctx.x_dtype), dw, None
