"""Uniform random token sequences: the dataset of throughput benchmarks (no data, no tokenizer),
optionally packed from documents of random lengths, as packed SFT rows are."""
from __future__ import annotations

import math

import torch


def document_lengths(seq: int, median: int, seed: int = 0) -> list[int]:
    """Lengths of documents packed to exactly `seq` tokens: log-normal around `median` (sigma 1, a long
    tail as in chat and reasoning SFT sets), at least 16 tokens, the last one cut to fit."""
    g = torch.Generator().manual_seed(seed)
    lengths, total = [], 0
    while total < seq:
        n = max(16, int(median * math.exp(torch.randn((), generator=g).item())))
        n = min(n, seq - total)
        lengths.append(n)
        total += n
    return lengths


class RandomTokens(torch.utils.data.Dataset):
    """`doc_median`: rows packed from documents of `document_lengths` (positions restart at each);
    None: one document per row."""

    def __init__(self, vocab: int, seq_length: int, num_samples: int = 1 << 20, seed: int = 0, doc_median: int | None = None):
        self.vocab, self.seq_length, self.num_samples, self.seed = vocab, seq_length, num_samples, seed
        self.doc_median = doc_median

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict:
        key = self.seed * 1_000_003 + i
        g = torch.Generator().manual_seed(key)
        seq = torch.randint(0, self.vocab, (self.seq_length + 1,), generator=g)
        row = {"tokens": seq[:-1], "labels": seq[1:], "loss_mask": torch.ones(self.seq_length)}
        if self.doc_median:
            row["position_ids"] = torch.cat([torch.arange(n) for n in document_lengths(self.seq_length, self.doc_median, key)])
        return row
