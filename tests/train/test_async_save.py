"""Asynchronous checkpoints (train.async_save): the step waits only for the host copy, a thread writes the
files, and the commit (`latest`) comes once they are all on disk."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from infir.model import ckpt_format

from trainrun import REPO, losses, run_train

FAST = ["logger=none", "precision=fp32", "train.log_interval=1", "train.eval_interval=0",
        "stage.seq_length=64", "stage.global_batch=2", "stage.micro_batch=2"]
WRITE_S = 1.0  # each file's write, slowed down


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_save_stalls_only_for_the_host_copy_and_writes_what_a_sync_save_does(demo_root, tmp_path, monkeypatch, device):
    """With every file's write slowed to a second, an asynchronous save returns long before its files are
    written, and training steps on (changing the weights and states) while they are (on CUDA also while the
    host copies are still being made, on a stream of their own that starts late here); the files it commits
    hold the saved step's values: byte for byte those a synchronous save of the same step writes on CPU; on
    CUDA, where the synchronous save pickles device tensors and the asynchronous one their pinned host copies
    (a storage's device is part of the pickle), the same tensors once loaded."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from infir.train import checkpoint
    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    write = checkpoint.write_file

    def slow(path, content):
        time.sleep(WRITE_S)
        write(path, content)

    monkeypatch.setattr(checkpoint, "write_file", slow)
    took, saved = {}, {}
    try:
        for mode in ("true", "false"):
            run_dir = tmp_path / f"async_{mode}"
            trainer = Trainer(compose([*FAST, f"data.root={demo_root}", f"run_dir={run_dir}", "stage.iters=10",
                                       f"train.async_save={mode}", f"device={device}"]))
            for step in range(2):
                trainer.train_step(step)
            trainer.step = 2
            if mode == "true" and device == "cuda":
                # the copies start ~0.3 s late: the next step's optimizer must wait for them on the GPU, and
                # save() must not
                with torch.cuda.stream(trainer.staging.stream):
                    torch.cuda._sleep(500_000_000)
            made = list(trainer.staging._buffers) if trainer.staging else []
            start = time.perf_counter()
            trainer.save()
            took[mode] = time.perf_counter() - start
            if mode == "true":  # the buffers were made after the first step; the save copied into them
                assert made and trainer.staging_bytes == sum(b.numel() for b in made)
                assert all(a is b for a, b in zip(trainer.staging._buffers, made, strict=True))
            committed_at_return = (run_dir / "checkpoints" / "latest").exists()
            trainer.train_step(2)  # steps on while the thread writes
            trainer.wait_save()
            saved[mode] = ckpt_format.resolve(run_dir / "checkpoints")
            trainer.log.finish()
            assert committed_at_return == (mode == "false")
    finally:
        distributed.shutdown()
    files = sorted(p.name for p in saved["false"].iterdir())
    assert files == sorted(p.name for p in saved["true"].iterdir()) and len(files) == 4, files
    assert took["false"] >= 3 * WRITE_S and took["true"] < WRITE_S, took
    for name in files:
        if device == "cpu" or not name.endswith(".pt"):
            assert (saved["true"] / name).read_bytes() == (saved["false"] / name).read_bytes(), name
        else:
            a, b = (torch.load(saved[m] / name, map_location="cpu", weights_only=False) for m in ("true", "false"))
            assert_same_tree(a, b, name)


def assert_same_tree(a, b, where: str) -> None:
    """Equal nested dicts/lists/tuples, tensors equal in dtype, shape and every element (NaNs included)."""
    assert type(a) is type(b), where
    if torch.is_tensor(a):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_tree(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, np.ndarray):  # numpy's RNG state in rng_rank*.pt
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.parametrize("reserved", [False, True])
def test_staged_views_of_one_storage_pickle_as_the_originals(tmp_path, reserved):
    """Tensors that are views of one storage (a flat state buffer's slices, a transpose) are staged as views of
    one host copy: torch.save writes the bytes it writes for the originals, and a second save into the same
    buffers writes the new values. Buffers reserved ahead are those the saves copy into: one per storage, of
    its size."""
    from infir.train.checkpoint import HostStaging

    flat = torch.arange(12.0)
    tree = {"a": flat[:4], "b": flat[4:].view(2, 4).t(), "n": 3, "same": flat[:4], "empty": torch.empty(0),
            "other": torch.ones(3, dtype=torch.bfloat16)}
    tree["alias"] = tree["a"]
    staging = HostStaging()
    if reserved:
        assert staging.reserve(tree) == 12 * 4 + 3 * 2
        made = list(staging._buffers)
        assert [b.numel() for b in made] == [48, 0, 6]
    sync, staged = tmp_path / "sync" / "state.pt", tmp_path / "staged" / "state.pt"  # torch.save names its archive after the file
    sync.parent.mkdir(), staged.parent.mkdir()
    for _ in range(2):
        torch.save(tree, sync)
        torch.save(staging.copy(tree), staged)
        assert staged.read_bytes() == sync.read_bytes()
        flat.add_(1)
        if reserved:
            assert all(a is b for a, b in zip(staging._buffers, made, strict=True))


def test_host_memory_that_cannot_be_pinned_is_one_line_naming_the_fix(monkeypatch):
    """cudaHostRegister refusing the staging buffer (the host is out of memory) is a ConfigError: infir-train
    prints it as one line, which names train.async_save=false."""
    from infir.train import checkpoint
    from infir.train.config import ConfigError

    class Refusing:
        def cudaHostRegister(self, ptr, size, flags):
            return 2  # cudaErrorMemoryAllocation

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Refusing())
    with pytest.raises(ConfigError, match=r"could not pin 1\.0 MiB .*train\.async_save=false"):
        checkpoint._pinned(2**20)


# Runs infir-train with the writes of checkpoint iter_0000004 held up: it marks the file named first on the
# command line when they begin, then waits to be killed.
STALLED_WRITER = """
import sys, time
from pathlib import Path
from infir.train import checkpoint
write, mark = checkpoint.write_file, Path(sys.argv[1])
def stalled(path, content):
    if path.parent.name == "iter_0000004.tmp":
        mark.touch()
        time.sleep(600)
    write(path, content)
checkpoint.write_file = stalled
sys.argv = ["infir-train", *sys.argv[2:]]
from infir.train.cli import main
main()
"""


@pytest.mark.slow
def test_a_kill_during_an_async_save_leaves_latest_on_the_last_complete_checkpoint(demo_root, tmp_path):
    args = [*FAST, f"data.root={demo_root}", "stage.iters=6", "train.save_interval=2"]
    run_train([*args, f"run_dir={tmp_path / 'whole'}"])
    run_dir, writing = tmp_path / "killed", tmp_path / "writing"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", STALLED_WRITER, str(writing), *args, f"run_dir={run_dir}"], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not writing.exists():
        time.sleep(0.1)
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpts = run_dir / "checkpoints"
    assert ckpt_format.resolve(ckpts).name == "iter_0000002" and not (ckpts / "iter_0000004").exists()
    out = run_train([*args, f"run_dir={run_dir}"])
    assert "resumed from" in out.stdout and "at step 2" in out.stdout
    whole, resumed = losses(tmp_path / "whole"), losses(run_dir)
    assert sorted(resumed) == list(range(1, 7))
    for step in range(1, 7):
        assert resumed[step] == pytest.approx(whole[step], rel=1e-6, abs=1e-6), step
    assert ckpt_format.resolve(ckpts).name == "iter_0000006"
