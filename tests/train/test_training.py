"""The training loop on CPU, end to end through `infir-train` (subprocesses, gloo)."""
from __future__ import annotations

import math
import os
import re
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from infir.model import ckpt_format

from trainrun import REPO, in_process_losses, losses, run_train, summary, train_cmd

FAST = ["logger=none", "precision=fp32", "train.log_interval=1", "train.eval_interval=0"]
SMALL = ["stage.seq_length=64", "stage.global_batch=2", "stage.micro_batch=2"]  # a fraction of a second a step


def demo(root, run_dir, *extra):
    return [*FAST, f"data.root={root}", f"run_dir={run_dir}", *extra]


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_tp2_with_sequence_parallel_matches_tp1(demo_root, tmp_path, overlap):
    """overlap: the sequence-parallel collectives split per rank around the GEMMs (parallel.tp_comm_overlap)."""
    steps = ["stage.iters=20"]
    run_train(demo(demo_root, tmp_path / "tp1", *steps))
    run_train(demo(demo_root, tmp_path / "tp2", *steps, "parallel=tp2", f"parallel.tp_comm_overlap={overlap}"), nproc=2)
    a, b = losses(tmp_path / "tp1"), losses(tmp_path / "tp2")
    assert sorted(a) == sorted(b) == list(range(1, 21))
    assert a[20] < a[1] - 1.0, "the model should learn on real text over 20 steps"
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-3 * abs(a[step]), (step, a[step], b[step])


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("precision", ["bf16", "fp8_blockwise_ue8m0"])
def test_gpu_tp2_with_compiled_layers_trains_as_one_rank(demo_root, tmp_path, precision, overlap):
    """On GPUs the layers are torch.compile'd and the collectives are NCCL's: TP=2 with sequence parallelism
    has one rank's gradient norm and loss curve within BF16's spread (the CPU test above runs neither)."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    from infir.train.metrics import read_metrics

    common = ["logger=none", "train.log_interval=1", "train.eval_interval=0", f"precision={precision}",
              f"data.root={demo_root}", "stage.iters=8", "stage.seq_length=256", "stage.global_batch=4",
              "stage.micro_batch=2"]
    run_train([*common, f"run_dir={tmp_path / 'tp1'}"])
    proc = run_train([*common, f"run_dir={tmp_path / 'tp2'}", "parallel=tp2", f"parallel.tp_comm_overlap={overlap}"],
                     nproc=2)
    # two GPUs of one host map each other's memory: the copy engines move the rows
    said = ("split per rank around their GEMMs, rows moved by the copy engines (symmetric memory)" if overlap
            else "before and after their GEMMs (parallel.tp_comm_overlap=false)")
    assert f"tensor parallel: sequence-parallel collectives {said}" in proc.stdout + proc.stderr, proc.stdout[-2000:]
    rows = {name: {r["step"]: r for r in read_metrics(tmp_path / name / "metrics.jsonl") if "loss" in r}
            for name in ("tp1", "tp2")}
    one, two = rows["tp1"], rows["tp2"]
    assert abs(two[1]["grad_norm"] - one[1]["grad_norm"]) <= 0.02 * one[1]["grad_norm"], (one[1], two[1])
    assert one[8]["loss"] < one[1]["loss"] - 0.5, "the model should learn on real text over 8 steps"
    for step in one:
        assert abs(two[step]["loss"] - one[step]["loss"]) <= 2e-2 * one[step]["loss"], (step, one[step], two[step])


@pytest.mark.slow
def test_killed_run_resumes_on_the_same_loss_curve(demo_root, tmp_path):
    args = ["stage.iters=24", "train.save_interval=8"]
    run_train(demo(demo_root, tmp_path / "whole", *args))
    # The same run, SIGKILLed after its step-8 checkpoint (mid-way to the next), then restarted.
    run_dir = tmp_path / "killed"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(train_cmd(demo(demo_root, run_dir, *args)), cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (run_dir / "checkpoints" / "latest").exists() and max(losses(run_dir), default=0) >= 11:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ckpt_format.resolve(run_dir / "checkpoints").name == "iter_0000008"
    out = run_train(demo(demo_root, run_dir, *args))
    assert "resumed from" in out.stdout and "at step 8" in out.stdout
    whole, resumed = losses(tmp_path / "whole"), losses(run_dir)
    assert sorted(resumed) == list(range(1, 25))
    for step in range(1, 25):
        assert resumed[step] == pytest.approx(whole[step], rel=1e-6, abs=1e-6), step
    assert summary(run_dir)["status"] == "finished"


def test_preemption_signal_saves_stops_and_lets_the_trainer_go(demo_root, tmp_path):
    """SIGUSR1 mid-run: the step in flight finishes, a checkpoint is written, train() returns; the
    process's own handler is back afterwards and nothing holds the dropped trainer (a bench that
    builds one trainer per case must get its memory back)."""
    import gc
    import weakref

    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    mine = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: mine.append(1))
    try:
        trainer = Trainer(compose(demo(demo_root, tmp_path, "stage.iters=20", "train.save_interval=100")))
        step = trainer.train_step

        def preempted_at_3(i):
            if i == 2:
                os.kill(os.getpid(), signal.SIGUSR1)
            return step(i)

        trainer.train_step = preempted_at_3
        trainer.train()
        assert trainer.step == 3 and not mine
        assert summary(tmp_path)["status"] == "interrupted"
        assert ckpt_format.resolve(tmp_path / "checkpoints").name == "iter_0000003"
        os.kill(os.getpid(), signal.SIGUSR1)
        assert mine == [1], "train() must give the process its own SIGUSR1 handler back"
        gone = weakref.ref(trainer)
        del trainer, step, preempted_at_3
        gc.collect()
        assert gone() is None, gc.get_referrers(gone())
    finally:
        signal.signal(signal.SIGUSR1, previous)
        distributed.shutdown()


def test_ctrl_c_saves_and_stops_in_one_line(demo_root, tmp_path):
    """SIGINT, as Ctrl-C sends it, mid-run: as SIGTERM, the step finishes, a checkpoint is written and the run
    says where it stopped, with no KeyboardInterrupt traceback; the rerun resumes from it."""
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    args = demo(demo_root, run_dir, *SMALL, "stage.iters=1000", "train.save_interval=1000")
    # SIGINT as a terminal leaves it: a background job (a CI runner's) starts its children with SIGINT ignored
    proc = subprocess.Popen(train_cmd(args), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:
            if line.startswith("step 2/"):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "infir-train: Ctrl-C: saving a checkpoint after this step, then stopping" in err
    stopped = re.search(r"stopping at step (\d+) \(SIGINT\); rerun the same command to resume", out)
    assert stopped, out[-2000:]
    assert ckpt_format.resolve(run_dir / "checkpoints").name == f"iter_{int(stopped.group(1)):07d}"
    assert summary(run_dir)["status"] == "interrupted"


def test_a_second_ctrl_c_stops_at_once_without_saving(demo_root, tmp_path, capfd):
    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, which a background job's SIG_IGN replaces
    try:
        trainer = Trainer(compose(demo(demo_root, tmp_path, *SMALL, "stage.iters=20", "train.save_interval=100")))
        step = trainer.train_step

        def ctrl_c_twice_at_3(i):
            if i == 2:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # the handler runs between the two
                os.kill(os.getpid(), signal.SIGINT)
            return step(i)

        trainer.train_step = ctrl_c_twice_at_3
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
        assert trainer.step == 2 and not (tmp_path / "checkpoints").exists()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, \
            "train() must give the process its own SIGINT handler back"
        assert capfd.readouterr().err.count("Ctrl-C again: stop at once, unsaved") == 1
        trainer.log.finish()
    finally:
        signal.signal(signal.SIGINT, previous)
        distributed.shutdown()


def test_resuming_with_another_data_order_is_refused_unless_allowed(demo_root, tmp_path, capsys):
    """stage.iters sizes the pretraining data megatron draws: a resume with another value reads other samples
    from the resumed step on. Refused, naming both values, before the run dir is touched; allowed, it warns."""
    from infir.train import dist as distributed
    from infir.train.cli import compose, run
    from infir.train.loop import Trainer

    first = demo(demo_root, tmp_path, *SMALL, "stage.iters=4", "train.save_interval=2", "train.exit_after=2")
    try:
        Trainer(compose(first)).train()
        config = (tmp_path / "config.yaml").read_text()
        with pytest.raises(SystemExit) as refused:
            run(compose(demo(demo_root, tmp_path, *SMALL, "stage.iters=6")))
        err = capsys.readouterr().err.strip()
        assert refused.value.code == 2 and len(err.splitlines()) == 1
        assert err == (f"infir-train: stage.iters=6 differs from stage.iters=4 of checkpoint {tmp_path}/checkpoints/"
                       "iter_0000002: resuming reads the training data in another order from step 2 on; resume with "
                       "stage.iters=4, or set train.allow_data_order_change=true to accept that")
        assert (tmp_path / "config.yaml").read_text() == config, "the refused run must not rewrite the run's config"
        allowed = Trainer(compose(demo(demo_root, tmp_path, *SMALL, "stage.iters=6", "train.allow_data_order_change=true")))
        out = capsys.readouterr().out
        assert "WARNING stage.iters=6 differs from stage.iters=4" in out and "(train.allow_data_order_change=true)" in out
        assert allowed.step == 2
        allowed.log.finish()
    finally:
        distributed.shutdown()


@pytest.mark.parametrize("error, code", [("KeyboardInterrupt", 130), ("SpikeError", 3)])
def test_the_cli_ends_a_stopped_run_in_one_line(demo_root, tmp_path, monkeypatch, capsys, error, code):
    """Ctrl-C while the trainer is built (before the loop's handler) or a spike stop: one line, no traceback."""
    from infir.train import cli, loop

    class Stopped:
        def __init__(self, cfg):
            raise KeyboardInterrupt if error == "KeyboardInterrupt" else loop.SpikeError("grad-norm spike at step 3")

    monkeypatch.setattr(loop, "Trainer", Stopped)
    try:
        cli.run(cli.compose(demo(demo_root, tmp_path)))
    except SystemExit as stop:
        exit_code = stop.code
    except KeyboardInterrupt:  # caught here: escaping, it would end the test session
        pytest.fail("Ctrl-C escaped infir-train's run: Python prints its traceback")
    err = capsys.readouterr().err
    assert exit_code == code and len(err.splitlines()) == 1 and err.startswith("infir-train: ")


def test_out_of_gpu_memory_ends_the_run_in_one_line_and_keeps_its_checkpoints(demo_root, tmp_path, monkeypatch, capsys):
    """torch's out-of-memory error in a step: one line naming the step, the allocation and what frees memory, exit
    code 5; the checkpoint written before it stays `latest`, and the run's summary says why it ended."""
    from infir.train import cli, loop

    train_step = loop.Trainer.train_step

    def short_of_memory(self, step):
        if step == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity "
                                         "of 79.19 GiB of which 1.02 GiB is free.")
        return train_step(self, step)

    monkeypatch.setattr(loop.Trainer, "train_step", short_of_memory)
    with pytest.raises(SystemExit) as stop:
        cli.run(cli.compose(demo(demo_root, tmp_path, *SMALL, "stage.iters=4", "train.save_interval=2")))
    err = capsys.readouterr().err
    assert stop.value.code == 5 and len(err.splitlines()) == 1, err
    assert err.startswith("infir-train: out of GPU memory in step 3 (tried to allocate 2.50 GiB): lower "
                          "stage.micro_batch"), err
    assert "model.recompute=full" in err and "resumes from the last one" in err
    assert ckpt_format.resolve(tmp_path / "checkpoints").name == "iter_0000002"
    assert summary(tmp_path)["status"] == "failed" and summary(tmp_path)["error"] == "out of GPU memory in step 3"


def test_crash_during_save_keeps_the_last_complete_checkpoint(demo_root, tmp_path):
    """A save that dies half-way leaves `latest` on the previous checkpoint, and the run resumes from it."""
    run_dir = tmp_path / "run"
    run_train(demo(demo_root, run_dir, "stage.iters=6", "train.save_interval=2", "train.exit_after=4"))
    ckpts = run_dir / "checkpoints"
    # What a crash mid-save leaves: a half-written next iteration directory, never committed.
    half = ckpts / "iter_0000006.tmp"
    half.mkdir()
    (half / "model_tp0.safetensors").write_bytes(b"\0" * 100)
    assert ckpt_format.resolve(ckpts).name == "iter_0000004"
    out = run_train(demo(demo_root, run_dir, "stage.iters=6", "train.save_interval=2"))
    assert "at step 4" in out.stdout
    assert ckpt_format.resolve(ckpts).name == "iter_0000006" and not half.exists()


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_failed_checkpoint_write_names_the_disk_and_keeps_the_last_checkpoint(demo_root, tmp_path, nproc):
    """A checkpoint write that fails (here: files capped between the model shard's size and the
    optimizer state's, so torch.save's zip writer fails as it does on a full disk) stops the run with a
    message naming the directory, the free space and the checkpoint to resume from; the half-written
    directory is gone, and a rerun resumes from the last one."""
    run_dir = tmp_path / "run"
    args = demo(demo_root, run_dir, "train.save_interval=2", *(["parallel=tp2"] if nproc == 2 else []))
    run_train([*args, "stage.iters=4", "train.exit_after=2"], nproc=nproc)

    shards = {f.name: f.stat().st_size for f in (run_dir / "checkpoints" / "iter_0000002").iterdir()}
    cap = (shards["model_tp0.safetensors"] + shards["train_tp0.pt"]) // 2
    assert shards["model_tp0.safetensors"] < cap < shards["train_tp0.pt"], shards

    def cap_file_size():  # in the child: writes past the cap fail with EFBIG instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))

    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(train_cmd([*args, "stage.iters=4"], nproc), cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, preexec_fn=cap_file_size)
    assert proc.returncode != 0
    ckpts = run_dir / "checkpoints"
    message = f"could not write checkpoint iter_0000004 in {ckpts}"
    assert message in proc.stderr and "free" in proc.stderr, proc.stderr[-3000:]
    assert f"the last complete checkpoint, {ckpts / 'iter_0000002'}, is untouched" in proc.stderr
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter_0000002", "latest"]
    assert summary(run_dir)["status"] == "failed" and message in summary(run_dir)["error"]
    out = run_train([*args, "stage.iters=4"], nproc=nproc)
    assert "at step 2" in out.stdout and ckpt_format.resolve(ckpts).name == "iter_0000004"


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_non_finite_loss_stops_clearly_and_keeps_checkpoints(demo_root, tmp_path, mode):
    # An absurd LR blows the weights up after the first update: step 2 onwards is non-finite.
    run_dir = tmp_path / mode
    proc = run_train(
        demo(demo_root, run_dir, "stage.iters=10", "stage.lr=1e30", "stage.min_lr=0", "stage.warmup_iters=0",
             "train.save_interval=1", f"train.on_nan={mode}", "train.max_skips=3"),
        check=False,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    advice = "or set train.on_nan=skip to skip such steps." if mode == "stop" else "or raise train.max_skips."
    assert "non-finite" in proc.stderr and advice in proc.stderr
    s = summary(run_dir)
    assert s["status"] == "failed" and "non-finite" in s["error"]
    latest = ckpt_format.resolve(run_dir / "checkpoints")
    assert (latest / "meta.json").exists() and (latest / "model_tp0.safetensors").exists()
    if mode == "skip":
        assert proc.stdout.count("step skipped") == 3
    logged = losses(run_dir)
    assert logged and all(math.isfinite(v) for v in logged.values())


@pytest.mark.slow
def test_demo_default_writes_checkpoint_metrics_and_plot(demo_root, tmp_path):
    """`infir-train` with the demo defaults (shortened): loss falls, and every promised file is there."""
    run_dir = tmp_path / "demo"
    out = run_train([f"data.root={demo_root}", f"run_dir={run_dir}", "logger=none", "stage.iters=30", "train.eval_interval=15"])
    assert "tok/s" in out.stdout and "ETA" in out.stdout
    curve = losses(run_dir)
    assert curve[30] < curve[10] - 0.5
    assert (run_dir / "loss.png").stat().st_size > 10_000
    assert (run_dir / "config.yaml").exists()
    s = summary(run_dir)
    assert s["status"] == "finished" and s["run_name"] == "tiny-bf16-cpt"
    assert "val_loss" in s and math.isfinite(s["val_loss"])
    assert ckpt_format.resolve(run_dir).name == "iter_0000030"


def test_sft_stage_starts_from_the_cpt_checkpoint_on_packed_samples(demo_root, tmp_path):
    """stage=sft1 reads packed chat samples (block-diagonal attention, loss on assistant tokens only)."""
    cpt, sft = tmp_path / "cpt", tmp_path / "sft1"
    run_train(demo(demo_root, cpt, "stage.iters=6"))
    out = run_train(demo(demo_root, sft, "stage=sft1", "stage.iters=6", f"init_from={cpt}"))
    assert "initialised weights from" in out.stdout and "iter_0000006" in out.stdout
    curve = losses(sft)
    assert sorted(curve) == list(range(1, 7)) and curve[6] < curve[1]
    assert summary(sft)["stage"] == "sft1"


def test_recomputation_under_bf16_autocast_gives_the_same_training_steps(demo_root, tmp_path):
    """Activation recomputation re-runs layers in the backward, outside the trainer's autocast:
    with FP32 master weights and BF16 autocast (precision=bf16) a full-recompute run once failed
    there with a BF16 x FP32 matmul. Recomputing must reproduce the plain run's steps."""
    results = in_process_losses({
        recompute: demo(demo_root, tmp_path / recompute, "precision=bf16", "stage.iters=3", f"model.recompute={recompute}")
        for recompute in ("none", "full", "selective")}, steps=3)
    assert results["full"] == pytest.approx(results["none"], rel=1e-6)
    assert results["selective"] == pytest.approx(results["none"], rel=1e-6)


def test_throughput_reports_tflops_and_mfu_per_gpu():
    """tokens_per_step counts every rank's tokens: TFLOP/s and MFU are per GPU, so two GPUs doing
    what one does at the same speed report the same MFU (the job total once read 113% at 7B, TP=2)."""
    from types import SimpleNamespace

    import torch

    from infir.train.loop import Trainer

    def rates(world):
        fake = SimpleNamespace(tokens_per_step=4096 * world, flops_per_token=1e10, peak=1000.0,
                               info=SimpleNamespace(world_size=world), device=torch.device("cpu"),
                               log=SimpleNamespace(start_time=time.time()),
                               optimizer=SimpleNamespace(state_bytes=lambda device: 3 * 2**29))
        return Trainer._throughput(fake, steps=10, seconds=1.0)

    one, two = rates(1), rates(2)
    assert two["tokens_per_s"] == 2 * one["tokens_per_s"]
    assert math.isclose(one["tflops"], 40960 * 1e10 / 1e12) and math.isclose(two["tflops"], one["tflops"])
    assert math.isclose(two["mfu"], one["tflops"] / 1000.0)
    assert one["optim_state_gib"] == 1.5
