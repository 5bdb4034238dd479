"""Steps the loop does not apply: non-finite ones (train.on_nan, train.max_skips) and gradient-norm spikes
(train.spike). Trainers run in this process on a small demo batch, with the bad steps injected by
replacing the trainer's gradient norm at chosen steps: what an FP8 overflow or a spike reports."""
from __future__ import annotations

import json
import math

import pytest
import torch

from infir.model import ckpt_format
from infir.train.cli import compose
from infir.train.loop import NonFiniteError, SpikeError, Trainer

SMALL = ["logger=none", "precision=fp32", "train.log_interval=1", "train.eval_interval=0",
         "stage.seq_length=64", "stage.global_batch=2", "stage.micro_batch=2", "train.save_interval=100"]
SPIKE = ["train.spike.window=3", "train.spike.factor=100"]


@pytest.fixture
def make_trainer(demo_root, tmp_path):
    from infir.train import dist as distributed

    made = []

    def make(*overrides: str) -> Trainer:
        made.append(Trainer(compose([*SMALL, f"data.root={demo_root}", f"run_dir={tmp_path / 'run'}", *overrides])))
        return made[-1]

    yield make
    for trainer in made:
        trainer.log.finish()
    distributed.shutdown()


def bad_norm_at(trainer: Trainer, steps: set[int], value: float) -> None:
    """The trainer's gradient norm reads `value` at these steps (1-based), its own at the others."""
    real = trainer._grad_norm

    def grad_norm():
        norm = real()  # on the device: the step brings it to the host with the loss
        return torch.full_like(norm, value) if trainer.step + 1 in steps else norm

    trainer._grad_norm = grad_norm


def weights_after_each_step(trainer: Trainer) -> list[list[torch.Tensor]]:
    after = []
    step = trainer.train_step

    def recorded(i):
        out = step(i)
        after.append([p.detach().clone() for p in trainer.params])
        return out

    trainer.train_step = recorded
    return after


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def skipped_logged(trainer: Trainer) -> list[int]:
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["skipped_steps"] for r in rows if "skipped_steps" in r]


def test_max_skips_counts_skips_in_a_row_and_the_total_is_logged(make_trainer, capsys):
    trainer = make_trainer("stage.iters=8", "train.on_nan=skip", "train.max_skips=2")
    bad_norm_at(trainer, {2, 4, 6, 7}, math.nan)
    trainer.train()
    assert (trainer.step, trainer.skipped) == (8, 4)
    assert json.loads((trainer.run_dir / "summary.json").read_text())["status"] == "finished"
    assert skipped_logged(trainer) == [1, 2, 3, 4]
    out = capsys.readouterr().out
    assert out.count("step skipped (1 in a row") == 3 and "(2 in a row, train.max_skips=2; 4 skipped in all)" in out


def test_skips_in_a_row_start_afresh_in_a_resumed_run(make_trainer):
    first = make_trainer("stage.iters=8", "train.on_nan=skip", "train.max_skips=2", "train.exit_after=2")
    bad_norm_at(first, {2}, math.nan)
    first.train()
    assert (first.step, first.skipped) == (3, 1)
    resumed = make_trainer("stage.iters=8", "train.on_nan=skip", "train.max_skips=2")
    bad_norm_at(resumed, {4, 5}, math.nan)
    resumed.train()
    assert (resumed.step, resumed.skipped) == (8, 3), "the total goes on; the limit counts only skips in a row"


@pytest.mark.parametrize("on_nan", ["stop", "skip"])
def test_the_stop_message_advises_only_what_is_not_set(make_trainer, on_nan):
    trainer = make_trainer("stage.iters=8", f"train.on_nan={on_nan}", "train.max_skips=1")
    bad_norm_at(trainer, {3, 4}, math.inf)
    with pytest.raises(NonFiniteError) as stop:
        trainer.train()
    message = str(stop.value)
    assert "precision=bf16" not in message, "fp32 has no FP8 overflow to rule out"
    if on_nan == "stop":
        assert message.startswith("non-finite step 3:") and message.endswith("or set train.on_nan=skip to skip such steps.")
    else:
        assert message.startswith("non-finite step 4:") and "train.max_skips=1 steps skipped in a row already" in message
        assert "train.on_nan" not in message and message.endswith("or raise train.max_skips.")
    assert "Lower stage.lr, check the data, or" in message


def test_a_spike_is_skipped_and_the_weights_stay(make_trainer, capsys):
    trainer = make_trainer("stage.iters=6", "train.spike.action=skip", *SPIKE)
    bad_norm_at(trainer, {4, 6}, 1e6)
    after = weights_after_each_step(trainer)
    trainer.train()
    assert (trainer.step, trainer.skipped) == (6, 2)
    assert same(after[3], after[2]) and same(after[5], after[4]) and not same(after[4], after[3])
    assert "grad-norm spike at step 4: 1e+06 > 100 x" in capsys.readouterr().out
    # the last step was skipped: the weights of step 5 are still saved as the run's end
    final = ckpt_format.resolve(trainer.ckpt_root)
    assert final.name == "iter_0000006"
    assert all(torch.equal(ckpt_format.load_shard(final, 0)[k], v) for k, v in ckpt_format.model_state(trainer.model.module).items())


def test_spikes_in_a_row_beyond_max_skips_stop_the_run(make_trainer):
    trainer = make_trainer("stage.iters=8", "train.spike.action=skip", "train.max_skips=1", *SPIKE)
    bad_norm_at(trainer, {5, 6}, 1e6)
    with pytest.raises(SpikeError, match=r"^grad-norm spike at step 6: .* train.max_skips=1 steps skipped in a row already.*"
                                         r"or raise train.spike.factor or train.max_skips\.$"):
        trainer.train()
    assert ckpt_format.resolve(trainer.ckpt_root).name == "iter_0000005"  # step 5 skipped, step 4's weights kept


def test_a_spike_rolls_back_to_the_last_checkpoint_and_skips_the_data_since(make_trainer, capsys):
    trainer = make_trainer("stage.iters=7", "train.save_interval=4", "train.spike.action=rollback", *SPIKE)
    bad_norm_at(trainer, {6}, 1e6)
    read, at_step_7 = [], {}
    micro_batches, step = trainer._micro_batches, trainer.train_step

    def reading(i):
        read.append(i)
        return micro_batches(i)

    def seen_at_7(i):
        if i == 6:  # step 7: the first after the rollback
            at_step_7["weights"] = {k: v.clone() for k, v in ckpt_format.model_state(trainer.model.module).items()}
            at_step_7["adam_steps"] = int(trainer.optimizer.optimizers[0].state[trainer.params[0]]["step"])
        return step(i)

    trainer._micro_batches, trainer.train_step = reading, seen_at_7
    trainer.train()
    saved = ckpt_format.load_shard(trainer.ckpt_root / "iter_0000004", 0)
    assert all(torch.equal(saved[k], v) for k, v in at_step_7["weights"].items())
    assert at_step_7["adam_steps"] == 4, "the optimizer's state is the checkpoint's too"
    assert read == list(range(7)), "after the rollback the run reads on from step 7: steps 5-6's data is skipped"
    assert (trainer.step, trainer.skipped) == (7, 2)
    out = capsys.readouterr().out
    assert f"rolled back to {trainer.ckpt_root / 'iter_0000004'} (step 4), the data of steps 5-6 skipped" in out
