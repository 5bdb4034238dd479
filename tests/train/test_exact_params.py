"""param_gather.ExactParams on CPU, without a process group: each rank packs its elements of the exact
parameters of several buckets into one run of `length` elements, and every rank unpacks the others' runs
into place, wherever the rank shares cut those parameters."""
from __future__ import annotations

import pytest
import torch

from infir.train.param_gather import ExactParams

RANKS = 3


def _buckets(rank: int) -> list[torch.Tensor]:
    """Two buckets of 12 and 9 elements as `rank` holds them: its own share right (100 + position, by bucket),
    the other ranks' elements stale (-1)."""
    out = []
    for b, n in enumerate((12, 9)):
        data = torch.full((n,), -1.0)
        share = n // RANKS
        data[rank * share:(rank + 1) * share] = 100.0 * (b + 1) + torch.arange(rank * share, (rank + 1) * share)
        out.append(data)
    return out


def test_every_rank_gets_every_exact_element_and_nothing_else():
    spans = [[(1, 6), (10, 12)], [(0, 2), (5, 9)]]  # cut by the shares [0, 4), [4, 8), [8, 12) and [0, 3) ...
    held = [_buckets(r) for r in range(RANKS)]
    exact = [ExactParams(list(zip(held[r], spans)), r, RANKS) for r in range(RANKS)]
    length = exact[0].length
    assert all(e.length == length for e in exact) and length == 5  # rank 0: 3 + 2, rank 1: 2 + 1, rank 2: 2 + 3
    wire = torch.zeros(RANKS, length)  # what the all-gather leaves on every rank
    for r, e in enumerate(exact):
        e.pack(wire[r])
    for r, e in enumerate(exact):
        e.land(list(wire))
        e.finish()
    for r in range(RANKS):
        for b, (data, bucket_spans) in enumerate(zip(held[r], spans)):
            share = data.numel() // RANKS
            truth = 100.0 * (b + 1) + torch.arange(data.numel(), dtype=torch.float32)
            mine = torch.zeros(data.numel(), dtype=torch.bool)
            mine[r * share:(r + 1) * share] = True
            wanted = mine.clone()
            for a, z in bucket_spans:
                wanted[a:z] = True
            assert torch.equal(data[wanted], truth[wanted]), (r, b)
            assert (data[~wanted] == -1).all(), (r, b)  # the rest stays as the rank held it


def test_one_dtype_a_gather():
    with pytest.raises(ValueError, match="one dtype"):
        ExactParams([(torch.zeros(4), [(0, 1)]), (torch.zeros(4, dtype=torch.bfloat16), [(0, 1)])], 0, 2)
    assert ExactParams([(torch.zeros(4), [])], 0, 2).length == 0
