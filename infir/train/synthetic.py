"""Uniform random token sequences: the dataset of throughput benchmarks (no data, no tokenizer)."""
from __future__ import annotations

import torch


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, vocab: int, seq_length: int, num_samples: int = 1 << 20, seed: int = 0):
        self.vocab, self.seq_length, self.num_samples, self.seed = vocab, seq_length, num_samples, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        seq = torch.randint(0, self.vocab, (self.seq_length + 1,), generator=g)
        return {"tokens": seq[:-1], "labels": seq[1:], "loss_mask": torch.ones(self.seq_length)}
