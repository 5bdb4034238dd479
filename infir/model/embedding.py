"""The token embedding's weight gradient added into megatron's `main_grad` row by row.

torch's embedding backward builds the table's whole gradient for the few thousand rows a micro-batch reads:
it zero-fills a [V/tp, h] tensor and scatters the rows in; tied to the LM head, autograd then sums it with the
head's gradient, and megatron DDP's hook adds the result into `main_grad`: three to four passes over the whole
vocabulary x hidden table a micro-batch, on the critical path between the backward's last GEMM and the embedding
bucket's reduce-scatter (the bucket no overlap hides). Here the lookup's backward adds its rows into the FP32
`main_grad` itself (`index_put_` with accumulate: sorted by row on CUDA, so the sum is deterministic), and
autograd gets nothing from it: the tied weight's hook adds only the LM head's gradient; an untied weight gets
an unwritten placeholder, which the hook skips (`grad_added_to_main_grad`), as infir's FP8 linears do for
their weight gradients.

Without megatron's FP32 `main_grad` (no DDP, gradient release, BF16 gradient buffers, whose row-by-row sums
would round at every repeated token) the lookup is torch's own.

Deferred rows (`defer_rows`, the data-parallel step's last micro-batch): the lookup's backward is the last of
the backward, and the bucket holding the table's gradient could be reduced only after it, with the whole
[V/tp, h] table on the wire and nothing left to hide it behind. Instead, that micro-batch's lookup holds no edge
to the weight (autograd reaches it through a leaf of no size), so the weight's gradient is complete after the LM
head's backward (tied; untied, before the backward: `ready_before_backward`), and its bucket (its own:
`separate_bucket`) is reduced beside the whole backward; the rows the lookup would have added wait, and
`add_deferred_rows` adds every rank's into the reduced gradient: a few thousand rows per rank instead of the table.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import VocabParallelEmbedding
from megatron.core.tensor_parallel.mappings import (
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)

from infir.model.main_grad import adds_into_main_grad


class _LookupIntoMainGrad(torch.autograd.Function):
    """The lookup of `weight` (the module's parameter, or a detached view of it when its rows are deferred, with
    `anchor`, a leaf of no size, keeping this backward in the graph), adding its rows into the parameter's
    main_grad in backward, or to `deferred`."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, anchor, module, deferred: list | None) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.module, ctx.deferred = module, deferred
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        weight = ctx.module.weight
        main = weight.main_grad
        rows = grad.reshape(-1, grad.shape[-1]).to(main.dtype)
        if ctx.deferred is not None:
            ctx.deferred.append((ids.reshape(-1), rows))
            return None, None, None, None, None
        main.index_put_((ids.reshape(-1),), rows, accumulate=True)
        if ctx.module.tied:
            return None, None, None, None, None
        weight.grad_added_to_main_grad = True  # megatron's zero_grad_buffer clears it each step
        return None, torch.empty_like(weight), None, None, None  # DDP's hook needs a .grad (overlap_grad_reduce asserts it)


class MainGradEmbedding(VocabParallelEmbedding):
    """megatron's VocabParallelEmbedding (same parameters, masking and reduction) whose lookup adds its weight
    gradient into main_grad (module docstring). Made by swapping the class of the embedding megatron built;
    `tied`: the weight is also the LM head's."""

    tied: bool = False
    deferred: list | None = None  # (ids, rows) of the lookups whose rows wait for add_deferred_rows
    _anchor: torch.Tensor | None = None

    def adds_rows_into_main_grad(self) -> bool:
        """Whether this forward's lookup adds its rows into main_grad (else it is torch's)."""
        return not self.deterministic_mode and adds_into_main_grad(self.weight)

    def defer_rows(self) -> None:
        """The next forwards' rows wait for add_deferred_rows, and their lookups leave the weight's gradient
        complete without them."""
        self.deferred = []

    def add_deferred_rows(self, group, scale: float) -> None:
        """Every rank of `group` (the data-parallel ranks the weight's gradient was reduced over) adds all ranks'
        deferred rows, times `scale` (the reduction's average), into its main_grad: after the reduction, the
        gradient of every token."""
        deferred, self.deferred = self.deferred, None
        if not deferred:
            return
        ids = torch.cat([i for i, _ in deferred])
        rows = torch.cat([r for _, r in deferred])
        ranks = dist.get_world_size(group)
        all_ids = ids.new_empty(ranks * ids.numel())
        all_rows = rows.new_empty(ranks * rows.shape[0], rows.shape[1])
        dist.all_gather_into_tensor(all_ids, ids, group=group)
        dist.all_gather_into_tensor(all_rows, rows, group=group)
        self.weight.main_grad.index_put_((all_ids,), all_rows.mul_(scale), accumulate=True)

    def forward(self, input_: torch.Tensor) -> torch.Tensor:
        if not self.adds_rows_into_main_grad():
            return super().forward(input_)
        # megatron's forward with the lookup replaced: each tensor-parallel rank holds a slice of the vocabulary,
        # looks up the ids inside it and contributes zeros for the others; the ranks' rows are summed
        tp = self.tp_group.size()
        if tp > 1:
            outside = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
            ids = (input_ - self.vocab_start_index).masked_fill(outside, 0)
        else:
            ids = input_
        if self.deferred is None:
            out = _LookupIntoMainGrad.apply(ids, self.weight, None, self, None)
        else:
            if self._anchor is None or self._anchor.device != ids.device:
                self._anchor = torch.zeros(0, device=ids.device, requires_grad=True)
            out = _LookupIntoMainGrad.apply(ids, self.weight.detach(), self._anchor, self, self.deferred)
        if tp > 1:
            out = out.masked_fill(outside.unsqueeze(-1), 0.0)  # row 0's gradient from these positions is zero
        if self.reduce_scatter_embeddings:
            return reduce_scatter_to_sequence_parallel_region(out.transpose(0, 1).contiguous(), group=self.tp_group)
        return reduce_from_tensor_model_parallel_region(out, group=self.tp_group)


def use_main_grad_lookup(model) -> None:
    """The token embedding of a megatron GPTModel (pre-process stage) as MainGradEmbedding, in place."""
    emb = getattr(getattr(model, "embedding", None), "word_embeddings", None)
    if emb is None or not isinstance(emb, VocabParallelEmbedding):
        return
    emb.__class__ = MainGradEmbedding
    emb.tied = bool(model.share_embeddings_and_output_weights)
    # megatron marks a tied weight `zero_out_wgrad`, so that its hook adds .grad even where a layer added into
    # main_grad itself: its own layers then hand autograd zeros. Here the lookup hands it nothing and the chunked
    # LM head an unwritten placeholder, which the hook must skip (gpt.py takes the head's main_grad path only where
    # the lookup takes its own).
    emb.weight.zero_out_wgrad = False
