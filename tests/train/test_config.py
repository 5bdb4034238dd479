"""A wrong config fails before training, with a message naming the key and the valid values."""
import re

import pytest
from hydra.errors import ConfigCompositionException

from infir.train.cli import compose
from infir.train.config import ConfigError, validate

from trainrun import run_train


def test_default_config_is_the_cpu_demo():
    cfg = compose([])
    validate(cfg)
    assert (cfg.model.name, cfg.data.name, cfg.stage.name, cfg.precision.name) == ("tiny", "demo", "cpt", "bf16")
    assert cfg.run_name == "tiny-bf16-cpt"


def test_unknown_group_option_lists_the_valid_ones():
    with pytest.raises(ConfigCompositionException) as e:
        compose(["model=qwen9"])
    assert "qwen2.5-1.5b" in str(e.value.__cause__ or e.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["parallel.tp=3"], "parallel.tp=3 does not divide model.heads=4"),
        (["stage.seq_length=4096"], "exceeds the model's max_positions=2048"),
        (["parallel=tp2", "stage.seq_length=255"], "must be divisible by parallel.tp=2"),
        (["stage.schedule=linear"], "stage.schedule='linear'"),
        (["train.on_nan=ignore"], "train.on_nan='ignore'"),
        (["train.gc_interval=0"], "train.gc_interval=0"),
        (["device=tpu"], "device='tpu'"),
        (["model.compile_mode=fast"], "model.compile_mode='fast'"),
        (["data=custom"], "data.tokenizer must be set"),
        (["init_from=/nonexistent/ckpt"], "init_from='/nonexistent/ckpt'"),
        (["stage.lr=1e-4", "stage.min_lr=1e-3"], "stage.min_lr=0.001"),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose(overrides))


def test_missing_data_source_is_named_before_training(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    proc = run_train(["data=custom", f"data.tokenizer={tok}", "data.sources.pretrain=null", f"run_dir={tmp_path / 'run'}"], check=False)
    assert proc.returncode != 0
    assert "data.sources.pretrain is not set" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("precision, recompute, mode", [
    ("fp8_blockwise_ue8m0", "none", "reduce-overhead"),
    ("fp8_blockwise_fp32", "none", "reduce-overhead"),
    ("fp8_blockwise_ue8m0", "full", "default"),    # recomputation has not run under CUDA graphs
    ("fp8_tensorwise", "none", "default"),
    ("moss", "none", "default"),
    ("bf16", "none", "default"),
])
def test_compile_mode_auto_takes_cuda_graphs_for_blockwise_fp8_only(precision, recompute, mode):
    import torch

    from infir.train.loop import compile_mode
    from infir.train.precision import build_recipe

    cfg = compose([f"precision={precision}", f"model.recompute={recompute}"])
    assert cfg.model.compile_mode == "auto"
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    recipe = build_recipe(cfg.precision)
    assert compile_mode(cfg.model.compile_mode, recipe, cfg.model.recompute, gpu) == mode
    assert compile_mode(cfg.model.compile_mode, recipe, cfg.model.recompute, cpu) == "default"  # no graphs on CPU
    assert compile_mode("default", recipe, recompute, gpu) == "default"  # an explicit mode wins
