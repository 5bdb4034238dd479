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
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import VocabParallelEmbedding
from megatron.core.tensor_parallel.mappings import (
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)

from infir.model.main_grad import adds_into_main_grad


class _LookupIntoMainGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, tied: bool) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight, ctx.tied = weight, tied
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        weight = ctx.weight
        main = weight.main_grad
        main.index_put_((ids.reshape(-1),), grad.reshape(-1, grad.shape[-1]).to(main.dtype), accumulate=True)
        if ctx.tied:
            return None, None, None
        weight.grad_added_to_main_grad = True  # megatron's zero_grad_buffer clears it each step
        return None, torch.empty_like(weight), None  # DDP's hook needs a .grad (overlap_grad_reduce asserts it)


class MainGradEmbedding(VocabParallelEmbedding):
    """megatron's VocabParallelEmbedding (same parameters, masking and reduction) whose lookup adds its weight
    gradient into main_grad (module docstring). Made by swapping the class of the embedding megatron built;
    `tied`: the weight is also the LM head's."""

    tied: bool = False

    def adds_rows_into_main_grad(self) -> bool:
        """Whether this forward's lookup adds its rows into main_grad (else it is torch's)."""
        return not self.deterministic_mode and adds_into_main_grad(self.weight)

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
        out = _LookupIntoMainGrad.apply(ids, self.weight, self.tied)
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
