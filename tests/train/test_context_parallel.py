"""Context parallelism end to end on CPU (gloo): the same data and seed give the same losses at CP=2 as
at CP=1, for packed SFT documents, for CPT documents split at EOD, and composed with TP=2."""
from __future__ import annotations

import pytest

from trainrun import losses, run_train

FAST = ["logger=none", "train.log_interval=1", "train.eval_interval=0", "stage.iters=20"]


def curves(demo_root, tmp_path, runs: dict[str, tuple[int, list[str]]]) -> dict[str, dict[int, float]]:
    out = {}
    for name, (nproc, extra) in runs.items():
        run_train([*FAST, f"data.root={demo_root}", f"run_dir={tmp_path / name}", *extra], nproc=nproc)
        out[name] = losses(tmp_path / name)
        assert sorted(out[name]) == list(range(1, 21))
    return out


def assert_same(a: dict[int, float], b: dict[int, float], rel: float) -> None:
    for step in a:
        assert abs(a[step] - b[step]) <= rel * abs(a[step]), (step, a[step], b[step])


@pytest.mark.slow
def test_cp2_matches_cp1_on_packed_sft_documents(demo_root, tmp_path):
    sft = ["precision=fp32", "stage=sft1", "stage.epochs=null"]
    got = curves(demo_root, tmp_path, {"cp1": (1, sft), "cp2": (2, [*sft, "parallel.cp=2"])})
    assert_same(got["cp1"], got["cp2"], rel=1e-5)


@pytest.mark.slow
def test_cp2_with_tp2_matches_one_rank_on_cpt_documents_split_at_eod(demo_root, tmp_path):
    docs = ["precision=fp32", "data.reset_attention_at_eod=true"]
    got = curves(demo_root, tmp_path, {
        "cp1": (1, docs), "cp2": (2, [*docs, "parallel.cp=2"]), "tp2cp2": (4, [*docs, "parallel=tp2", "parallel.cp=2"]),
        "causal": (1, ["precision=fp32"]),
    })
    assert_same(got["cp1"], got["cp2"], rel=1e-5)
    # Tensor parallelism sums partial products in another order: the TP=2 test's tolerance.
    assert_same(got["cp1"], got["tp2cp2"], rel=1e-3)
    # Documents split at EOD attend less than whole rows: a different (if close) loss curve.
    assert any(abs(got["cp1"][s] - got["causal"][s]) > 1e-4 for s in got["cp1"])


@pytest.mark.gpu
def test_cp2_matches_cp1_on_two_gpus_in_bf16(demo_root, tmp_path):
    """NCCL and the CUDA kernels (varlen on packed SFT rows): CP=2 within BF16's run-to-run spread of CP=1."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    sft = ["stage=sft1", "stage.epochs=null", "precision=bf16"]
    got = curves(demo_root, tmp_path, {"cp1": (1, sft), "cp1_again": (1, [*sft, "seed=1235"]), "cp2": (2, [*sft, "parallel.cp=2"])})
    spread = max(abs(got["cp1"][s] - got["cp1_again"][s]) / got["cp1"][s] for s in got["cp1"])
    assert_same(got["cp1"], got["cp2"], rel=max(2 * spread, 1e-2))


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_each_context_parallel_rank_counts_its_own_loss_tokens_on_the_host(cp):
    """`loss_tokens` (what the step sums over the ranks for its token mean, without a GPU collective) is each
    rank's share of the loss mask: the shares add up to the batch's."""
    import torch

    from infir.train.batch import to_model_inputs

    g = torch.Generator().manual_seed(0)
    batch = {"tokens": torch.randint(0, 50, (2, 32), generator=g), "labels": torch.randint(0, 50, (2, 32), generator=g),
             "loss_mask": (torch.rand(2, 32, generator=g) > 0.3).float()}
    shares = [to_model_inputs(batch, torch.device("cpu"), cp, r) for r in range(cp)]
    for share in shares:
        assert isinstance(share["loss_tokens"], float) and share["loss_tokens"] == float(share["loss_mask"].sum())
    assert sum(s["loss_tokens"] for s in shares) == float(batch["loss_mask"].sum())
