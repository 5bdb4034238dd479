"""ZeRO-1 end to end on CPU (gloo): with the optimizer states sharded over two data-parallel ranks, every
optimizer takes the same steps as with replicated states (the same losses, bit for bit), and follows one
rank on the whole batch; its checkpoint resumes where it stopped."""
from __future__ import annotations

import shutil

import pytest
import torch

from trainrun import losses, run_train, summary

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
    # rank 0 holds the states of the first half of each bucket: half of them, and more by what the buckets'
    # padding (megatron pads each to a multiple of 2^16 elements, tens of thousands here) puts in rank 1's half
    states = {name: summary(tmp_path / name)["optim_state_gib"] for name in ("dp2", "zero")}
    assert states["dp2"] / 2 <= states["zero"] <= 0.65 * states["dp2"], states
    # one rank sums each gradient over the whole batch, two ranks sum halves: FP32 rounding apart. The BF16
    # weights of the memory-efficient optimizers turn a rounding difference into a bf16 step now and then.
    rel = 1e-6 if optimizer == "adamw" else 1e-3
    for step in one:
        assert abs(one[step] - sharded[step]) <= rel * one[step], (step, one[step], sharded[step])


@pytest.mark.slow
def test_fp8_weights_follow_the_gathered_parameters(demo_root, tmp_path):
    """Under sharded states each layer's FP8 weights are re-quantized once its parameters are gathered, also
    where one bucket holds several layers (its gather is completed by the first layer's wait): the same steps
    as replicated states, bit for bit, with the FP8 copies kept for the step or made per layer forward."""
    common = ["precision=fp8_blockwise_ue8m0"]
    replicated = curve(demo_root, tmp_path / "dp2", 2, [*common, "optimizer.distributed=false"], steps=6)
    for cache in ("true", "false"):
        sharded = curve(demo_root, tmp_path / f"zero_{cache}", 2, [*common, f"model.fp8_weight_cache={cache}"], steps=6)
        assert sharded == replicated, (cache, sharded, replicated)


@pytest.mark.slow
def test_bf16_runs_gather_the_parameters_as_bf16_and_take_the_replicated_steps(demo_root, tmp_path):
    """Under the BF16 recipe the sharded FP32 parameters cross as BF16 (their norms' weights exactly): every GEMM
    reads what it reads under replicated states, so the same steps, bit for bit, for half the bytes; and the
    checkpoint holds the exact FP32 parameters."""
    from infir.model import ckpt_format as fmt

    # small buckets: rank shares cut the norms' weights, which cross behind the BF16 shares
    common = ["precision=bf16", "train.save_interval=6", "optimizer.bucket_size=20000"]
    replicated = curve(demo_root, tmp_path / "dp2", 2, [*common, "optimizer.distributed=false"], steps=6)
    proc = run_train([*FAST, "stage.iters=6", f"data.root={demo_root}", f"run_dir={tmp_path / 'zero'}", *common], nproc=2)
    line = next(ln for ln in proc.stdout.splitlines() if "parameter all-gather" in ln)
    assert "as BF16" in line, line
    assert losses(tmp_path / "zero") == replicated
    saved = [fmt.load_shard(run / "checkpoints" / "iter_0000006", 0) for run in (tmp_path / "zero", tmp_path / "dp2")]
    for key, t in saved[0].items():
        if isinstance(t, torch.Tensor):
            assert torch.equal(t, saved[1][key]), key


@pytest.mark.slow
def test_sharded_checkpoint_resumes_on_the_same_curve_at_any_data_parallel_layout(demo_root, tmp_path):
    """Each rank writes its share of the states. A run stopped at a checkpoint takes the uninterrupted run's
    steps when resumed as it was, with other bucket cuts, with replicated states, or on one rank: the states
    are joined and re-cut by element range (FlashAdamW's scale groups included)."""
    common = ["optimizer=flash_adamw", "precision=fp32", "train.save_interval=3"]
    whole = curve(demo_root, tmp_path / "whole", 2, [*common, "optimizer.bucket_size=20000"], steps=6)
    stopped = tmp_path / "stopped"
    run_train([*FAST, "stage.iters=6", f"data.root={demo_root}", f"run_dir={stopped}", *common,
               "optimizer.bucket_size=20000", "train.exit_after=3"], nproc=2)
    ckpt = stopped / "checkpoints" / "iter_0000003"
    assert sorted(f.name for f in ckpt.glob("optim_*")) == ["optim_tp0_dp0.pt", "optim_tp0_dp1.pt"]
    layouts = {"same": (2, ["optimizer.bucket_size=20000"]), "other_buckets": (2, ["optimizer.bucket_size=50000"]),
               "replicated": (2, ["optimizer.distributed=false"]), "one_rank": (1, [])}
    for name, (nproc, extra) in layouts.items():
        run_dir = tmp_path / name
        shutil.copytree(stopped, run_dir)
        resumed = curve(demo_root, run_dir, nproc, [*common, *extra], steps=6)
        # one rank sums the batch's gradient in another order than two: FP32 rounding apart
        rel = 0.0 if nproc == 2 else 1e-3
        for step in whole:
            assert abs(resumed[step] - whole[step]) <= rel * whole[step], (name, step, whole[step], resumed[step])


@pytest.mark.slow
def test_bf16_gradient_buffers_train_as_fp32_ones_do(demo_root, tmp_path):
    """optimizer.grad_reduce_dtype=bf16: FlashOptim's 16-bit gradients (7 bytes a parameter with
    flash_adamw), accumulated and reduce-scattered in BF16; the curve stays on the FP32-gradient one."""
    common = ["optimizer=flash_adamw", "precision=bf16"]
    fp32 = curve(demo_root, tmp_path / "fp32", 2, common, steps=10)
    bf16 = curve(demo_root, tmp_path / "bf16", 2, [*common, "optimizer.grad_reduce_dtype=bf16"], steps=10)
    assert fp32 != bf16  # the setting reaches the buffers
    for step in fp32:
        assert abs(fp32[step] - bf16[step]) <= 2e-2 * fp32[step], (step, fp32[step], bf16[step])


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


def test_a_layout_that_does_not_divide_the_processes_names_the_valid_ones(monkeypatch):
    from infir.train import dist as distributed
    from infir.train.config import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "6")
    with pytest.raises(ConfigError, match=r"parallel.tp x parallel.cp = 4 x 1 = 4 does not divide the 6 processes: "
                                          r"launch a multiple of 4 processes \(tp x cp x dp\), or make tp x cp one of "
                                          r"\[1, 2, 3, 6\]"):
        distributed.init(tp=4, device_choice="cpu")


def test_a_global_batch_that_does_not_split_over_the_ranks_is_refused_in_one_line(demo_root, tmp_path):
    proc = run_train([*FAST, "stage.global_batch=3", f"data.root={demo_root}", f"run_dir={tmp_path / 'run'}"], nproc=2,
                     check=False)
    assert proc.returncode != 0
    assert ("infir-train: stage.global_batch=3 is not a multiple of stage.micro_batch x data-parallel ranks (1 x 2 = 2): "
            "use 2 or 4, or change stage.micro_batch or the number of processes") in proc.stderr, proc.stderr
    assert "infir/train/loop.py" not in proc.stderr  # the ranks' one line, no traceback of theirs (torchrun adds its own)


def test_close_waits_for_the_gathers_the_last_step_started(demo_root, tmp_path):
    """Trainer.close ends the parameter gathers the last optimizer step started: a process that goes on
    (bench/step.py's next case) must not inherit them: GPU cases torn down with gathers pending left the whole
    FP32 parameter buffer allocated."""
    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    try:
        trainer = Trainer(compose(["logger=none", f"data.root={demo_root}", f"run_dir={tmp_path}", "stage.iters=2",
                                   "optimizer.distributed=true"]))   # ZeRO-1 over one rank: its gathers all the same
        trainer.train_step(0)
        opt = trainer.optimizer
        pending = [p for bucket in [*opt._pending, *opt._queue] for p in bucket.params]
        assert pending and all(p.gather_pending for p in pending)
        trainer.close()
        assert not opt._pending and not opt._queue and not any(p.gather_pending for p in pending)
    finally:
        distributed.shutdown()


def test_the_parameter_gathers_run_one_bucket_ahead_of_the_forward(demo_root, tmp_path):
    """The step starts the gather of the bucket the forward reads first; the forward starts each next one as
    it takes the bucket before it, so that a gather is never started behind one the forward does not wait for
    there and then (on a GPU it would hold up the compute queued behind it). Every bucket's gather has started
    by the end of the forward, in order."""
    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    try:
        trainer = Trainer(compose(["logger=none", f"data.root={demo_root}", f"run_dir={tmp_path}", "stage.iters=2",
                                   "optimizer.distributed=true", "optimizer.bucket_size=20000"]))
        opt = trainer.optimizer
        trainer.train_step(0)
        order = [part.bucket for part in reversed(opt.parts)]
        assert len(order) > 4 and list(opt._pending) == order[:1] and opt._queue == order[1:]
        started, needed, held_up = [], set(), []
        start, wait_for = opt._start_next, opt.wait_for

        def recording_wait_for(params):
            needed.clear()
            needed.update(opt._bucket_of[p] for p in params if p in opt._bucket_of)
            return wait_for(params)

        def recording_start():
            if opt._queue:
                started.append(opt._queue[0])
                # a started gather that this forward hook does not wait for
                held_up.extend(b for b in opt._pending if b not in needed)
            start()

        opt._start_next, opt.wait_for = recording_start, recording_wait_for
        trainer._forward(trainer._micro_batches(1)[0])
        assert started == order[1:] and not held_up
        trainer.close()
    finally:
        distributed.shutdown()


@pytest.mark.parametrize(("device", "averaged"), [("cuda", True), ("cpu", False)])
def test_nccl_averages_the_gradients_inside_the_reduce(device, averaged):
    """On GPUs megatron averages in the collective (NCCL's AVG) instead of scaling every gradient bucket by
    1/DP in a pass of its own first; on CPUs (gloo) the pass stays."""
    from types import SimpleNamespace

    from infir.train.cli import compose
    from infir.train.loop import ddp_config

    info = SimpleNamespace(dp=2, cp=1, device=torch.device(device))
    assert ddp_config(compose(["logger=none"]).optimizer, info).average_in_collective is averaged
