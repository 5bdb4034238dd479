"""ZeRO-1 end to end on CPU (gloo): with the optimizer states sharded over two data-parallel ranks, every
optimizer takes the same steps as with replicated states (the same losses, bit for bit), and follows one
rank on the whole batch; its checkpoint resumes where it stopped."""
from __future__ import annotations

import pytest
import torch

from trainrun import losses, run_train

FAST = ["logger=none", "train.log_interval=1", "train.eval_interval=0", "stage.global_batch=4", "stage.micro_batch=1"]
STEPS = 20


def curve(demo_root, run_dir, nproc: int, extra: list[str], steps: int = STEPS) -> dict[int, float]:
    run_train([*FAST, f"stage.iters={steps}", f"data.root={demo_root}", f"run_dir={run_dir}", *extra], nproc=nproc)
    got = losses(run_dir)
    assert sorted(got) == list(range(1, steps + 1))
    return got


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "flash_adamw", "sr_adamw", "offload_adamw"])
def test_sharded_states_take_the_replicated_steps(demo_root, tmp_path, optimizer):
    common = [f"optimizer={optimizer}", "precision=fp32"]
    one = curve(demo_root, tmp_path / "dp1", 1, common)
    replicated = curve(demo_root, tmp_path / "dp2", 2, [*common, "optimizer.distributed=false"])
    sharded = curve(demo_root, tmp_path / "zero", 2, [*common, "optimizer.bucket_size=20000"])
    assert sharded == replicated
    # one rank sums each gradient over the whole batch, two ranks sum halves: FP32 rounding apart. The BF16
    # weights of the memory-efficient optimizers turn a rounding difference into a bf16 step now and then.
    rel = 1e-6 if optimizer == "adamw" else 1e-3
    for step in one:
        assert abs(one[step] - sharded[step]) <= rel * one[step], (step, one[step], sharded[step])


@pytest.mark.slow
def test_sharded_checkpoint_resumes_on_the_same_curve_and_refuses_another_layout(demo_root, tmp_path):
    """Each rank writes its share of the states; a run stopped at a checkpoint and resumed takes the steps
    of the uninterrupted run; resuming those shards with replicated states is refused in one line."""
    common = ["optimizer=sr_adamw", "precision=fp32", "train.save_interval=3", "optimizer.bucket_size=20000"]
    whole = curve(demo_root, tmp_path / "whole", 2, common, steps=6)
    run_dir = tmp_path / "stopped"
    run_train([*FAST, "stage.iters=6", f"data.root={demo_root}", f"run_dir={run_dir}", *common, "train.exit_after=3"], nproc=2)
    ckpt = run_dir / "checkpoints" / "iter_0000003"
    assert sorted(f.name for f in ckpt.glob("optim_*")) == ["optim_tp0_dp0.pt", "optim_tp0_dp1.pt"]
    refused = run_train([*FAST, "stage.iters=6", f"data.root={demo_root}", f"run_dir={run_dir}", *common,
                         "optimizer.distributed=false"], nproc=2, check=False)
    assert refused.returncode != 0 and "holds optimizer states sharded over data-parallel ranks" in refused.stderr
    resumed = curve(demo_root, run_dir, 2, common, steps=6)
    assert resumed == whole


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp8_blockwise_ue8m0"])
def test_sharded_states_on_two_gpus(demo_root, tmp_path, precision):
    """NCCL, overlapped bucket reduce-scatters and the parameter all-gather behind each bucket's step:
    sharded states within BF16's run-to-run spread of replicated ones, FP8 weight caches refreshed from
    the gathered weights."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    common = ["optimizer=flash_adamw", f"precision={precision}"]
    replicated = curve(demo_root, tmp_path / "dp2", 2, [*common, "optimizer.distributed=false"])
    again = curve(demo_root, tmp_path / "dp2_seed", 2, [*common, "optimizer.distributed=false", "seed=1235"])
    sharded = curve(demo_root, tmp_path / "zero", 2, [*common, "optimizer.bucket_size=1000000"])
    spread = max(abs(replicated[s] - again[s]) / replicated[s] for s in replicated)
    worst = max(abs(replicated[s] - sharded[s]) / replicated[s] for s in replicated)
    assert worst <= max(2 * spread, 1e-2), (worst, spread)
