"""bench/hf_peer.py, the HF transformers peer of bench/step.py, on CPU: its shape is ours, torchao's
float8 (emulated here) replaces exactly the block linears, and both variants train."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from hf_peer import HfTrainer, build_hf_model  # noqa: E402

from infir.model.qwen import get_size  # noqa: E402


def test_peer_has_our_parameter_count_and_fp8_only_on_the_block_linears():
    from torchao.float8.float8_linear import Float8Linear

    size = get_size("tiny")
    bf16 = build_hf_model(size, "hf_bf16", torch.device("cpu"), compile_layers=False)
    assert sum(p.numel() for p in bf16.parameters()) == size.num_params()
    fp8 = build_hf_model(size, "hf_torchao_tensorwise", torch.device("cpu"), compile_layers=False)
    converted = [n for n, m in fp8.named_modules() if isinstance(m, Float8Linear)]
    assert len(converted) == 7 * size.layers, converted  # q, k, v, o, gate, up, down per layer
    assert not isinstance(fp8.lm_head, Float8Linear)


def test_both_peer_variants_train():
    size = get_size("tiny")
    for precision in ("hf_bf16", "hf_torchao_tensorwise"):
        peer = HfTrainer(size, precision, seq=64, mbs=2, accum=2, device="cpu", compile_layers=False, lr=3e-3)
        losses = [float(peer.train_step()) for _ in range(6)]
        assert all(torch.isfinite(torch.tensor(losses))), (precision, losses)
        assert losses[-1] < losses[0] - 0.5, (precision, losses)  # one fixed batch: it is learned
    with pytest.raises(ValueError, match="one of hf_bf16, hf_torchao_tensorwise"):
        build_hf_model(size, "hf_fp16", torch.device("cpu"), compile_layers=False)


def test_compiled_peer_traces_one_graph_for_all_layers():
    """Every layer shares one compiled graph: a per-layer recompile (the KV cache's layer index, once)
    ran into dynamo's recompile limit at 28 layers and left the peer mostly eager, 3x slow."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    peer = HfTrainer(get_size("tiny"), "hf_bf16", seq=64, mbs=2, accum=2, device="cpu")
    for _ in range(2):
        peer.train_step()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
