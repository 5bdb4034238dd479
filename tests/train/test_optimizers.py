"""`optimizer=` switches the trainer to infir.optim's memory-efficient AdamW variants (BF16 params)."""
from __future__ import annotations

import pytest

from infir.model import ckpt_format

from trainrun import losses, run_train, summary

FAST = ["logger=none", "train.log_interval=1", "train.eval_interval=0", "stage.iters=16"]


@pytest.fixture(scope="module")
def adamw_curve(demo_root, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("adamw")
    run_train([*FAST, f"data.root={demo_root}", f"run_dir={run_dir}"])
    return losses(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["flash_adamw", "sr_adamw"])
def test_memory_efficient_optimizer_trains_like_adamw_and_resumes_exactly(demo_root, tmp_path, adamw_curve, optimizer):
    whole = tmp_path / "whole"
    run_train([*FAST, f"data.root={demo_root}", f"run_dir={whole}", f"optimizer={optimizer}"])
    curve = losses(whole)
    assert curve[16] < curve[1] - 1.0
    assert abs(curve[16] - adamw_curve[16]) < 0.02 * adamw_curve[16], (curve[16], adamw_curve[16])
    # Stop after 8 steps (checkpoint with the optimizer's 8-bit / BF16 states), restart: the same curve.
    split = tmp_path / "split"
    run_train([*FAST, f"data.root={demo_root}", f"run_dir={split}", f"optimizer={optimizer}", "train.exit_after=8"])
    assert summary(split)["status"] == "interrupted" and ckpt_format.resolve(split).name == "iter_0000008"
    run_train([*FAST, f"data.root={demo_root}", f"run_dir={split}", f"optimizer={optimizer}"])
    resumed = losses(split)
    assert [resumed[s] for s in range(1, 17)] == [curve[s] for s in range(1, 17)]


def test_each_optimizer_declares_what_the_trainer_needs():
    import inspect

    import torch

    from infir.optim import OPTIMIZERS, optimizer_spec
    from infir.train import loop

    adamw = optimizer_spec("adamw")  # FP32 masters, steps on .grad, clips inside its fused kernel
    assert adamw.param_dtype == torch.float32 and not adamw.reads_main_grad
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert adamw.clips_in_step(torch.optim.AdamW(params, fused=True))
    assert not adamw.clips_in_step(torch.optim.AdamW(params, fused=False))
    for name in set(OPTIMIZERS) - {"adamw"}:  # BF16 weights that read main_grad themselves
        spec = optimizer_spec(name)
        assert spec.param_dtype == torch.bfloat16 and spec.reads_main_grad and not spec.fused_grad_scale, name
    assert not any(f'"{name}"' in inspect.getsource(loop) for name in OPTIMIZERS)  # the loop tests no names
