"""optimizer.grad_release (FlashOptim's gradient release) in the trainer on CPU: each parameter steps inside
backward from its own gradient, which is freed at once; the steps are those of the same run with 16-bit
gradients stepped after backward, and what needs every gradient first is refused in one line."""
from __future__ import annotations

import pytest

from trainrun import losses, run_train

RUN = ["logger=none", "train.log_interval=1", "train.eval_interval=0", "stage.global_batch=4", "stage.micro_batch=4",
       "stage.grad_clip=0", "optimizer=flash_adamw", "precision=bf16"]


@pytest.mark.slow
def test_released_steps_are_the_steps_after_backward(demo_root, tmp_path):
    common = [*RUN, "stage.iters=8", f"data.root={demo_root}"]
    run_train([*common, f"run_dir={tmp_path / 'release'}", "optimizer.grad_release=true"])
    run_train([*common, f"run_dir={tmp_path / 'after'}", "optimizer.grad_reduce_dtype=bf16"])
    released, after = losses(tmp_path / "release"), losses(tmp_path / "after")
    assert sorted(released) == list(range(1, 9)) and released == after


def test_each_parameter_steps_inside_backward_and_keeps_no_gradient(demo_root, tmp_path):
    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    trainer = Trainer(compose([*RUN, "stage.iters=2", f"data.root={demo_root}", f"run_dir={tmp_path / 'run'}",
                               "optimizer.grad_release=true"]))
    try:
        inner = trainer.optimizer.optimizers[0]
        stepped = []
        step_param = inner.step_param
        inner.step_param = lambda p, group: (stepped.append(p), step_param(p, group))
        out = trainer.train_step(0)
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        assert out["finite"] and len(stepped) == len(params) and {id(p) for p in stepped} == {id(p) for p in params}
        assert all(p.grad is None and not hasattr(p, "main_grad") for p in params)
    finally:
        trainer.log.finish()
        distributed.shutdown()


@pytest.mark.parametrize("override, message", [
    ("optimizer=adamw", "optimizer='adamw' is not valid: expected one of flash_adamw, sr_adamw, bf16_adamw_rn with "
                        "optimizer.grad_release=true"),
    ("stage.grad_clip=1.0", "stage.grad_clip=1.0 is not valid: expected 0 with optimizer.grad_release=true"),
    ("train.spike.action=skip", "train.spike.action='skip' is not valid: expected none with optimizer.grad_release=true"),
])
def test_what_needs_every_gradient_first_is_refused_in_one_line(demo_root, tmp_path, override, message):
    proc = run_train([*RUN, f"data.root={demo_root}", f"run_dir={tmp_path / 'run'}", "optimizer.grad_release=true",
                      override], check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"infir-train: {message}") and proc.stderr.count("\n") == 1, proc.stderr


def test_gradient_release_on_more_than_one_rank_is_refused(demo_root, tmp_path):
    proc = run_train([*RUN, f"data.root={demo_root}", f"run_dir={tmp_path / 'run'}", "optimizer.grad_release=true",
                      "stage.global_batch=8"], nproc=2, check=False)
    assert proc.returncode != 0, proc.stderr  # each rank exits with 2; torchrun reports the failure as its own
    assert "optimizer.grad_release=true steps each parameter inside one backward on one rank" in proc.stderr
