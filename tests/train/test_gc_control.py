"""train.gc_interval: Python's garbage collector paced by the training loop (StepGC)."""
import gc

import pytest

from infir.train.gc_control import StepGC


@pytest.fixture
def collections():
    """The generation of every collection that starts while the test runs."""
    started = []

    def record(phase, info):
        if phase == "start":
            started.append(info["generation"])

    was = gc.isenabled()
    gc.enable()
    gc.callbacks.append(record)
    try:
        yield started
    finally:
        gc.callbacks.remove(record)
        gc.enable() if was else gc.disable()


def test_collects_only_at_its_interval_then_restores_the_collector(collections):
    with StepGC(3) as paced:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        collections.clear()
        for step in range(1, 8):
            _ = [[] for _ in range(5000)]  # enough new containers to start automatic collections
            paced.after_step(step)
        assert collections == [2, 2]  # full collections after steps 3 and 6, no automatic one
        assert paced.collections == 2 and paced.seconds > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_none_leaves_python_alone(collections):
    with StepGC(None) as paced:
        assert gc.isenabled() and gc.get_freeze_count() == 0
        paced.after_step(1000)
        _ = [[] for _ in range(5000)]
    assert paced.collections == 0 and len(collections) > 0  # the automatic collector ran


def test_an_error_inside_still_restores_the_collector(collections):
    with pytest.raises(RuntimeError):
        with StepGC(10):
            raise RuntimeError("a failing step")
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("interval", [0, -5, True, 2.5, "10"])
def test_a_bad_interval_is_refused(interval):
    with pytest.raises(ValueError, match="gc interval must be null or an integer >= 1"):
        StepGC(interval)


def test_the_training_loop_collects_every_gc_interval_steps(demo_root, tmp_path):
    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    try:
        trainer = Trainer(compose(["logger=none", "precision=fp32", "train.eval_interval=0", f"data.root={demo_root}",
                                   f"run_dir={tmp_path}", "stage.iters=5", "train.gc_interval=2"]))
        trainer.train()
        assert trainer.step == 5 and trainer.gc.collections == 2  # after steps 2 and 4
        assert gc.isenabled()
    finally:
        distributed.shutdown()
