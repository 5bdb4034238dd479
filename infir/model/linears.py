"""megatron's tensor-parallel linears with the matmul as an ordinary autograd op that a recipe can swap.

megatron's ColumnParallelLinear / RowParallelLinear route their matmul through `_forward_impl`, by
default a custom autograd Function (LinearWithGradAccumulationAndAsyncCommunication) that (a)
re-enters autocast in backward for CUDA only, so BF16 autocast breaks on CPU, (b) is opaque to
torch.compile's fusion, and (c) hard-wires a BF16 GEMM. We keep megatron's modules (parameters,
initialisation, TP sharding, sequence-parallel reduce-scatter, checkpoint keys) and override only
`_forward_impl`: the tensor-parallel communication on the input side, then `self.matmul`.

Communication (column-parallel input side), with megatron's own autograd mappings:
- sequence parallel: all-gather the sequence shards (backward: reduce-scatter of dgrad);
- tensor parallel without SP: identity (backward: all-reduce of dgrad);
The row-parallel output side (all-reduce or reduce-scatter) stays in megatron's RowParallelLinear.forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)


def column_input(x: torch.Tensor, *, allreduce_dgrad: bool, sequence_parallel: bool, tp_group) -> torch.Tensor:
    if sequence_parallel:
        return gather_from_sequence_parallel_region(x, group=tp_group)
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
    """Row-parallel linear (attention out, FC2): partial sums, reduced by megatron's forward."""

    def _forward_impl(self, input, weight, bias=None, **_):
        return self.matmul(input, weight, bias)

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)
