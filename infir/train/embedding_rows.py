"""The token embedding's gradient reduced beside the backward, its last micro-batch's rows added after.

The embedding lookup is the first op of the forward, so its backward is the last of the backward: a bucket
holding the [V/tp, h] table's gradient was complete only then, and its reduce-scatter (932 MB in FP32 for
Qwen2.5-1.5B's tied table) ran with nothing left to hide it behind, the longest exposed collective of a
data-parallel step. Here (infir.model.embedding's deferred rows) the step's last micro-batch's lookup leaves
the table's gradient complete without its rows: after the LM head's backward where the table is tied to it,
before the backward where it is not. The table sits in a bucket of its own (megatron's bucket split for a
shared embedding under the distributed optimizer), reduced while the layers' backward runs, and every rank's
deferred rows (tokens x h, a few MB) are gathered and added into the reduced gradient after the reduction.
Earlier micro-batches add their rows into main_grad before any reduction, as before.
"""
from __future__ import annotations

import torch

from infir.model.embedding import MainGradEmbedding


def _lookup(model: torch.nn.Module) -> MainGradEmbedding | None:
    emb = getattr(getattr(model, "embedding", None), "word_embeddings", None)
    return emb if isinstance(emb, MainGradEmbedding) else None


def defers_rows(model: torch.nn.Module, oc, grad_ranks: int, tokens: int) -> bool:
    """Whether the trainer reduces the table's gradient before its last rows: megatron's FP32 gradient buffers
    reduced during the backward (optimizer.overlap_grad_reduce) over more than one rank, where the rows all
    ranks gather (one per token of a micro-batch, `tokens` on each) are fewer than the table's (at 32k tokens
    and 8 ranks they are not: the reduction of the table itself moves less, and holds less memory)."""
    lookup = _lookup(model)
    return (lookup is not None and 1 < grad_ranks and grad_ranks * tokens < lookup.weight.shape[0]
            and oc.overlap_grad_reduce and not oc.grad_release and oc.grad_reduce_dtype == "fp32")


def separate_bucket(model: torch.nn.Module) -> None:
    """Before megatron's DDP is built: the table gets a gradient bucket of its own (under the distributed
    optimizer; replicated states reduce one all-reduce per bucket as megatron groups them)."""
    _lookup(model).weight.shared_embedding = True


class DeferredRows:
    """The step's calls around its last micro-batch (`ddp`: megatron's DDP model; `group`: the ranks the
    gradients are reduced over)."""

    def __init__(self, ddp, group, grad_ranks: int):
        self.ddp, self.group, self.grad_ranks = ddp, group, grad_ranks
        self.lookup = _lookup(ddp.module)

    def before_last_forward(self) -> None:
        self.lookup.defer_rows()

    def before_last_backward(self) -> None:
        """An untied table's gradient is complete before the backward: ready for its reduction (a tied one is
        once the LM head's backward has added into it, through megatron's own hook)."""
        if not self.lookup.tied and self.lookup.adds_rows_into_main_grad():
            w = self.lookup.weight
            self.ddp.param_to_bucket_group[w].register_grad_ready(w)

    def after_reduction(self) -> None:
        """Every rank's deferred rows into the reduced gradient, averaged as megatron averages the buckets."""
        self.lookup.add_deferred_rows(self.group, 1.0 / self.grad_ranks)
