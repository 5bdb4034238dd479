"""When the trainer defers the embedding's last rows (infir.train.embedding_rows.defers_rows): megatron's FP32
buckets reduced during the backward over several ranks, and fewer rows gathered than the table holds. The
deferral itself is tested in tests/model/test_lm_loss.py (gradients) and tests/train/test_zero.py (steps)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from infir.model.embedding import MainGradEmbedding
from infir.train.embedding_rows import defers_rows
from infir.train.schema import OptimizerConfig


def model_with_table(rows: int):
    emb = MainGradEmbedding.__new__(MainGradEmbedding)
    torch.nn.Module.__init__(emb)
    emb.weight = torch.nn.Parameter(torch.zeros(rows, 4))
    return SimpleNamespace(embedding=SimpleNamespace(word_embeddings=emb))


@pytest.mark.parametrize("ranks, tokens, overrides, defers", [
    (2, 49, {}, True),                                   # 98 rows gathered < 100 in the table
    (2, 50, {}, False),                                  # as many as the table: reduce the table itself
    (1, 10, {}, False),                                  # nothing to reduce
    (4, 10, {"overlap_grad_reduce": False}, False),      # reduced after the backward anyway
    (4, 10, {"grad_reduce_dtype": "bf16"}, False),       # no FP32 main_grad rows
    (4, 10, {"grad_release": True}, False),              # no DDP
])
def test_rows_are_deferred_where_the_reduction_overlaps_and_they_are_fewer_than_the_table(ranks, tokens, overrides, defers):
    oc = OptimizerConfig(name="adamw", **overrides)
    assert defers_rows(model_with_table(100), oc, ranks, tokens) is defers


def test_a_model_without_the_main_grad_lookup_defers_nothing():
    assert not defers_rows(SimpleNamespace(embedding=None), OptimizerConfig(name="adamw"), 4, 10)
