"""bench/linear.py's byte count of the quantizers, the base of its bandwidth columns and floor line,
held to bench/quant.py's per-kernel counts (CPU: no kernel runs)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import linear  # noqa: E402
import quant  # noqa: E402


def _bytes(rows, cols, kernel):
    return {name: n for name, _, n in quant.cases(torch.empty(rows, cols, dtype=torch.bfloat16))}[kernel]


@pytest.mark.parametrize("M,K,N", [(8192, 1536, 2048), (256, 896, 1152), (128, 18944, 3584)])
def test_linear_quant_bytes_are_the_quant_benchs(M, K, N):
    both = "token both layouts (X and X^T, one launch)"
    acts = _bytes(M, K, both) + _bytes(M, N, both)
    assert linear.quant_bytes(M, K, N, weight=False) == acts
    assert linear.quant_bytes(M, K, N) == acts + _bytes(N, K, "block 128x128 (W)")
