"""Checkpoints resumed at another tensor-parallel size: weights and optimizer states re-cut as `infir-convert`
cuts the weights, FlashAdamW's 8-bit states regrouped (exactly where a new group lies in one saved group)."""
from __future__ import annotations

import math
import shutil
from types import SimpleNamespace

import pytest
import torch

from infir.optim import FlashAdamW
from infir.optim.base import unpacked_state
from infir.optim.companding import dequantize_momentum, dequantize_variance
from infir.optim.ranges import per_element
from infir.train import reshard

from trainrun import losses, run_train, summary

GROUPED = FlashAdamW.GROUPED_STATES


def flash_state(shape, steps: int = 3) -> dict:
    """FlashAdamW's state of one BF16 parameter after a few steps on random gradients."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape).to(torch.bfloat16))
    opt = FlashAdamW([p], lr=1e-2)
    for _ in range(steps):
        p.grad = torch.randn(shape).to(torch.bfloat16)
        opt.step()
    return unpacked_state(opt.state_dict()["state"][0])


def recut(name: str, states: list[dict], saved_shape: tuple, tp: int, rank: int) -> dict:
    n = math.prod(saved_shape)
    return reshard._recut(name, [per_element(s, n, GROUPED) for s in states], saved_shape,
                          SimpleNamespace(tp=tp, tp_rank=rank), GROUPED, FlashAdamW.requantized)


def decoded(state: dict, shape) -> tuple[torch.Tensor, torch.Tensor]:
    return (dequantize_momentum(state["m_codes"].view(shape), state["m_scales"]),
            dequantize_variance(state["v_codes"].view(shape), state["v_scales"]))


@pytest.mark.parametrize("name, shape", [
    ("decoder.layers.0.self_attention.linear_qkv.weight", (64, 32)),  # column
    ("decoder.layers.0.self_attention.linear_qkv.bias", (128,)),
    ("decoder.layers.0.mlp.linear_fc1.weight", (64, 32)),  # gated: gate and up halves split apart
    ("decoder.layers.0.self_attention.linear_proj.weight", (16, 128)),  # row: 64 columns a rank, whole groups
    ("decoder.layers.0.input_layernorm.weight", (96,)),  # replicated
])
def test_aligned_states_split_and_merge_back_exactly(name, shape):
    """Where every 32-element group of a TP shard is a group of the whole parameter, the 8-bit states move
    unchanged: each shard decodes to its slice of the whole state, and merging the shards gives it back bit for bit."""
    whole = flash_state(shape)
    shards = [recut(name, [whole], shape, 2, rank) for rank in range(2)]
    shard_shape = reshard.shard_shape(name, shape, 1, 2)
    from infir.model.convert import split_tensor

    for rank, shard in enumerate(shards):
        for got, want in zip(decoded(shard, shard_shape), decoded(whole, shape)):
            assert torch.equal(got, split_tensor(name, want, 2)[rank])
    merged = recut(name, shards, shard_shape, 1, 0)
    assert merged.keys() == whole.keys()
    for key, value in whole.items():
        assert torch.equal(merged[key].reshape(-1), value.reshape(-1)) if torch.is_tensor(value) else merged[key] == value


def test_a_split_inside_a_group_requantizes_only_that_group():
    """FC2 of the tiny model: 352 columns, 176 a rank at TP=2, so a row's last group of a rank holds 16
    elements of a TP=1 group and 16 of the next row's. Such groups cannot keep one saved scale: they are
    quantized afresh from the decoded values (one more 8-bit rounding: within half a code step of the group's
    absmax, 1/127 for momentum; the square root of variance likewise within 1/255), the rest stay bit for bit."""
    name, shape = "decoder.layers.0.mlp.linear_fc2.weight", (4, 352)
    whole = flash_state(shape)
    m, v = decoded(whole, shape)
    for rank in range(2):
        shard = recut(name, [whole], shape, 2, rank)
        cols = slice(rank * 176, (rank + 1) * 176)
        got_m, got_v = decoded(shard, (4, 176))
        assert (got_m - m[:, cols]).abs().max() <= m[:, cols].abs().max() / 127
        assert (got_v.sqrt() - v[:, cols].sqrt()).abs().max() <= v[:, cols].sqrt().max() / 255
        # each element of the shard at its place in the whole parameter; a shard group inside one saved group keeps it
        i = torch.arange(4 * 176)
        at = (i // 176) * 352 + rank * 176 + i % 176
        saved_group = (at // 32).view(-1, 32)
        kept = (saved_group == saved_group[:, :1]).all(dim=1)
        assert 0 < kept.sum() < kept.numel()
        assert torch.equal(shard["m_scales"][kept], whole["m_scales"][saved_group[kept, 0]])
        assert torch.equal(shard["v_codes"].view(-1, 32)[kept], whole["v_codes"].reshape(-1)[at].view(-1, 32)[kept])
        assert not torch.equal(shard["m_scales"], whole["m_scales"][saved_group[:, 0]])


FAST = ["logger=none", "train.log_interval=1", "train.eval_interval=0", "stage.global_batch=4", "stage.micro_batch=1",
        "precision=fp32", "train.save_interval=3", "stage.iters=6"]
LAYOUTS = {"tp2_dp1": (2, ["parallel=tp2"]), "tp1_dp2": (2, []), "tp2_dp2": (4, ["parallel=tp2"]), "tp1_dp4": (4, [])}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, saved, resumed", [
    *((o, a, b) for o in ("adamw", "flash_adamw") for a, b in (("tp2_dp1", "tp1_dp2"), ("tp1_dp2", "tp2_dp1"))),
    ("adamw", "tp2_dp2", "tp1_dp4"),   # TP and DP sizes both change
])
def test_a_checkpoint_resumes_at_another_tensor_parallel_size(demo_root, tmp_path, optimizer, saved, resumed):
    """A run stopped at step 3 at one layout and resumed at the other takes the uninterrupted run's steps.
    Tolerance: AdamW's FP32 steps on the tiny model come out equal here, but TP changes the summation order of
    the row-parallel GEMMs and the norms, so a few FP32 ulps (1e-6) are allowed. FlashAdamW keeps BF16 weights
    and 8-bit states grouped along each shard's flat elements: the continued run rounds in other groups than the
    uninterrupted one, and FC2's straddling groups were requantized once, so 1e-4 (measured: <= 5e-5)."""
    common = [*FAST, f"optimizer={optimizer}", f"data.root={demo_root}", "optimizer.bucket_size=20000"]
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    (n_saved, saved_args), (n_resumed, resumed_args) = LAYOUTS[saved], LAYOUTS[resumed]
    run_train([*common, *saved_args, f"run_dir={whole}"], nproc=n_saved)
    run_train([*common, *saved_args, f"run_dir={stopped}", "train.exit_after=3"], nproc=n_saved)
    out = run_train([*common, *resumed_args, f"run_dir={stopped}"], nproc=n_resumed)
    assert "at step 3" in out.stdout
    assert summary(stopped)["tp"] == (2 if resumed.startswith("tp2") else 1)
    want, got = losses(whole), losses(stopped)
    assert sorted(got) == list(range(1, 7))
    rel = 1e-6 if optimizer == "adamw" else 1e-4
    for step in range(4, 7):
        assert abs(got[step] - want[step]) <= rel * want[step], (step, want[step], got[step])
