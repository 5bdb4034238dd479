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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graph", [False, True])
def test_in_step_quant_time_is_two_quantizers_inside_the_step(graph):
    """The profiled quantize time of a cached-weight FP8 fwd+bwd: X's and dY's quantizers found, and no other
    kernel (the L2 flush's fill, the GEMMs), in a CUDA graph's replay too; their time a part of the step's."""
    from infir.fp8 import Fp8Linear

    flush = linear.l2_flush()
    layer = Fp8Linear(1536, 2048, bias=False, recipe="fp8_blockwise_ue8m0", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1024, 1536, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    seen = []
    step_ms = linear.fwd_bwd_ms(layer, x, dy, graph=graph, probe=lambda run: seen.append(
        linear.quant_in_step_ms(run, flush, expected_calls=2)))
    assert len(seen) == 1 and 0 < seen[0] < step_ms
    with pytest.raises(RuntimeError, match="expected 3 quantize kernels"):
        linear.fwd_bwd_ms(layer, x, dy, graph=graph, probe=lambda run: linear.quant_in_step_ms(run, flush, 3))
