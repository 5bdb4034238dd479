"""The FP8 parameter all-gather under ZeRO-1 on CPU (gloo): with the FP8 linears' weights gathered as FP8
bytes, two data-parallel ranks take the same steps as with the parameters gathered (the same losses, bit
for bit: each layer reads the same FP8 weight), send fewer bytes, and save the same weights. Buckets of
20000 elements cut the weights inside 128x128 blocks, where the block amax has to be joined over ranks."""
from __future__ import annotations

import re

import pytest
import torch

from infir.model import ckpt_format as fmt
from trainrun import losses, run_train

FAST = ["logger=none", "train.log_interval=1", "train.eval_interval=0", "stage.global_batch=4", "stage.micro_batch=1",
        "stage.iters=6", "train.save_interval=6", "optimizer.bucket_size=20000"]


def _run(demo_root, run_dir, extra: list[str]) -> tuple[dict, float, str]:
    """(losses, MiB a rank sends per step in its parameter gathers, the startup line saying so)."""
    proc = run_train([*FAST, f"data.root={demo_root}", f"run_dir={run_dir}", *extra], nproc=2)
    line = next(ln for ln in proc.stdout.splitlines() if "parameter all-gather" in ln)
    return losses(run_dir), float(re.search(r"all-gather ([\d.]+) MiB", line).group(1)), line


@pytest.mark.slow
@pytest.mark.parametrize("precision, optimizer", [("fp8_blockwise_ue8m0", "flash_adamw"), ("fp8_blockwise_fp32", "adamw")])
def test_fp8_gather_takes_the_parameter_gathers_steps(demo_root, tmp_path, precision, optimizer):
    common = [f"precision={precision}", f"optimizer={optimizer}"]
    fp8, fp8_mib, fp8_line = _run(demo_root, tmp_path / "fp8", [*common, "optimizer.fp8_param_gather=true"])
    plain, plain_mib, plain_line = _run(demo_root, tmp_path / "plain", [*common, "optimizer.fp8_param_gather=false"])
    assert "FP8 weights as FP8" in fp8_line and "FP8" not in plain_line
    assert fp8 == plain and sorted(fp8) == list(range(1, 7))
    assert fp8_mib < plain_mib, (fp8_mib, plain_mib)
    # the ranks' stale elements of the FP8 weights are gathered in full before a checkpoint is written
    saved = [fmt.load_shard(run / "checkpoints" / "iter_0000006", 0) for run in (tmp_path / "fp8", tmp_path / "plain")]
    assert saved[0].keys() == saved[1].keys()
    for key, t in saved[0].items():
        if isinstance(t, torch.Tensor):
            assert torch.equal(t, saved[1][key]), key


@pytest.mark.slow
def test_fp8_gather_sends_the_rest_as_bf16_and_fewer_bytes_than_the_bf16_recipe(demo_root, tmp_path):
    """FP32 masters (adamw): beside the FP8 weights as FP8, the buckets without them (the embedding's) cross as
    BF16, as under the BF16 recipe, so the FP8 recipe's gather sends less than the BF16 recipe's, by the ratio
    infir.train.comm_volume predicts, and its steps stay bit for bit those of the plain gather. Buckets of 1M
    elements here: megatron pads each bucket to a multiple of 65536 elements, which the model leaves out, and
    which 20000-element buckets would make most of what crosses."""
    from infir.model.qwen import get_size
    from infir.train.comm_volume import Layout, dp_collectives, trainer_data_parallel
    from infir.train.schema import OptimizerConfig

    buckets = "optimizer.bucket_size=1000000"
    fp8, fp8_mib, line = _run(demo_root, tmp_path / "fp8", ["precision=fp8_blockwise_ue8m0", "optimizer=adamw",
                                                             "optimizer.fp8_param_gather=true", buckets])
    plain, _, _ = _run(demo_root, tmp_path / "plain", ["precision=fp8_blockwise_ue8m0", "optimizer=adamw", buckets])
    _, bf16_mib, _ = _run(demo_root, tmp_path / "bf16", ["precision=bf16", "optimizer=adamw", buckets])
    assert "buckets without them as BF16" in line and fp8 == plain
    oc, layout, size = OptimizerConfig(name="adamw", bucket_size=1_000_000), Layout(dp=2), get_size("tiny")

    def gathered(dp) -> float:
        return sum(c.bytes * c.calls for c in dp_collectives(size, layout, dp) if c.name == "parameters")

    want = gathered(trainer_data_parallel(oc, layout, "amax", bf16_params=True)) / gathered(
        trainer_data_parallel(oc, layout, bf16_params=True))
    assert want < 1 and abs(fp8_mib / bf16_mib - want) <= 0.1 * want, (fp8_mib, bf16_mib, want)


def test_the_parameters_are_gathered_unless_asked(demo_root, tmp_path):
    _, _, line = _run(demo_root, tmp_path / "default", ["precision=fp8_blockwise_ue8m0", "stage.iters=1"])
    assert "FP8" not in line


@pytest.mark.parametrize("overrides, nproc, message", [
    (["precision=bf16"], 1, "optimizer.fp8_param_gather=True is not valid: expected false with precision=bf16"),
    (["precision=fp8_blockwise_ue8m0"], 1, "optimizer.fp8_param_gather=true needs sharded optimizer states"),
])
def test_fp8_gather_without_its_conditions_is_refused_in_one_line(demo_root, tmp_path, overrides, nproc, message):
    proc = run_train([*FAST, f"data.root={demo_root}", f"run_dir={tmp_path / 'run'}", *overrides,
                      "optimizer.fp8_param_gather=true"], nproc=nproc, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"infir-train: {message}") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.gpu
def test_fp8_gather_on_two_gpus(demo_root, tmp_path):
    """NCCL and the Triton range quantizers: the FP8-gathered run within BF16's run-to-run spread of the
    parameter-gathered one, and fewer bytes sent."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    common = ["precision=fp8_blockwise_ue8m0", "optimizer=flash_adamw", "stage.iters=20", "train.save_interval=20"]
    fp8, fp8_mib, _ = _run(demo_root, tmp_path / "fp8", [*common, "optimizer.fp8_param_gather=true"])
    plain, plain_mib, _ = _run(demo_root, tmp_path / "plain", [*common, "optimizer.fp8_param_gather=false"])
    again, _, _ = _run(demo_root, tmp_path / "again", [*common, "optimizer.fp8_param_gather=false", "seed=1235"])
    spread = max(abs(plain[s] - again[s]) / plain[s] for s in plain)
    worst = max(abs(plain[s] - fp8[s]) / plain[s] for s in plain)
    assert worst <= max(2 * spread, 1e-2), (worst, spread)
    assert fp8_mib < plain_mib
