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


def column_input(x: torch.Tensor, *, allreduce_dgrad: bool, sequence_parallel: bool, tp_group) -> torch.Tensor:
    if sequence_parallel:
        return sequence_gather(x, tp_group)
    if allreduce_dgrad:
        return copy_to_tensor_model_parallel_region(x, group=tp_group)
    return x


class ColumnLinear(ColumnParallelLinear):
    """Column-parallel linear (QKV, FC1): Y_i = X W_i^T on each TP rank."""

    def _forward_impl(self, input, weight, bias=None, *, allreduce_dgrad=False, sequence_parallel=False, tp_group=None, **_):
        x = column_input(input, allreduce_dgrad=allreduce_dgrad, sequence_parallel=sequence_parallel, tp_group=tp_group)
        return self.matmul(x, weight, bias)

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)


class RowLinear(RowParallelLinear):
    """Row-parallel linear (attention out, FC2): partial sums, reduced by megatron's forward, or under
    sequence parallelism reduce-scattered here."""

    def forward(self, input_):
        if not self.sequence_parallel or self.explicit_expert_comm:
            return super().forward(input_)
        out = sequence_reduce_scatter(self._forward_impl(input_, self.weight), self.tp_group)
        if self.skip_bias_add or self.bias is None:
            return out, self.bias if self.skip_bias_add else None
        return out + self.bias, None

    def _forward_impl(self, input, weight, bias=None, **_):
        return self.matmul(input, weight, bias)

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)
