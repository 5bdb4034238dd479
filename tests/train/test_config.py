"""A wrong config fails before training, with a message naming the key and the valid values."""
import os
import re

import pytest

from infir.train.cli import compose
from infir.train.config import ConfigError, validate

from trainrun import run_train


def test_default_config_is_the_cpu_demo():
    cfg = compose([])
    validate(cfg)
    assert (cfg.model.name, cfg.data.name, cfg.stage.name, cfg.precision.name) == ("tiny", "demo", "cpt", "bf16")
    assert cfg.run_name == "tiny-bf16-cpt"


def test_unknown_group_option_lists_the_valid_ones():
    with pytest.raises(ConfigError, match=r"^model=qwen9 is not valid: expected one of .*qwen2\.5-1\.5b"):
        compose(["model=qwen9"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        # a key its group's dataclass does not declare, also when added with `+`
        (["stage.foo=1"], "stage.foo is not a key of stage: expected one of name, dataset, seq_length"),
        (["+stage.foo=1"], "stage.foo is not a key of stage: expected one of name, dataset, seq_length"),
        (["model.bogus=1"], "model.bogus is not a key of model: expected one of name, init_std"),
        (["logger.tensorboard=true"], "logger.tensorboard is not a key of logger: expected one of name, wandb, project"),
        (["foo=1"], "foo is not a key of the config: expected one of model, precision"),
        # a value of the wrong type
        (["stage.lr=abc"], "stage.lr='abc' is not valid: expected a number"),
        (["parallel.tp=x"], "parallel.tp='x' is not valid: expected an integer"),
        (["stage.iters=1.5"], "stage.iters=1.5 is not valid: expected an integer"),
        (["model.compile=maybe"], "model.compile='maybe' is not valid: expected auto (on a GPU), true or false"),
        # a value out of its field's range, blamed on that field
        (["stage.lr=-1"], "stage.lr=-1.0 is not valid: expected a positive number"),
        (["stage.micro_batch=0"], "stage.micro_batch=0 is not valid: expected a positive integer"),
        (["train.log_interval=0"], "train.log_interval=0 is not valid: expected a positive integer"),
        (["optimizer.eps=0"], "optimizer.eps=0.0 is not valid: expected a positive number"),
        (["optimizer.betas=[0.9]"], "optimizer.betas=[0.9] is not valid: expected two numbers in [0, 1)"),
        (["optimizer.name=lion"], "optimizer.name='lion' is not valid: expected one of adamw,"),
        (["logger.wandb=maybe"], "logger.wandb='maybe' is not valid: expected one of disabled, offline, online"),
    ],
)
def test_compose_rejects_a_bad_field_in_one_line_naming_it(overrides, message):
    with pytest.raises(ConfigError) as e:
        compose(overrides)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


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
        (["stage.iters=null", "stage.epochs=null"], "stage.epochs=None"),
        (["data=synthetic", "stage=sft1", "stage.iters=5"], "stage.dataset='sft1'"),
        (["run_dir=/proc/infir-run"], "run_dir='/proc/infir-run' is not valid: expected a directory this process can write"),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose(overrides))


@pytest.mark.parametrize("yaml, message", [
    ("name: tiny\ninit_sdt: 0.02\n", "model.init_sdt is not a key of model: expected one of name, init_std,"),
    ("name: tiny\ninit_std: big\n", "model.init_std='big' is not valid: expected a number"),
    ("name: tiny\nrecompute: some\n", "model.recompute='some' is not valid: expected one of none, full, selective"),
])
def test_a_group_yaml_is_checked_against_its_schema(yaml, message, tmp_path, monkeypatch):
    import shutil

    from infir.train.cli import conf_dir

    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    (conf / "model" / "mine.yaml").write_text(yaml)
    monkeypatch.setenv("INFIR_CONF", str(conf))
    with pytest.raises(ConfigError) as e:
        compose(["model=mine"])
    assert str(e.value).startswith(message)


def test_a_typed_default_fills_a_key_the_yaml_leaves_out():
    cfg = compose([])
    assert cfg.optimizer.kwargs == {} and cfg.train.gc_interval is None
    assert compose(["+optimizer.kwargs.seed=7"]).optimizer.kwargs == {"seed": 7}


@pytest.fixture
def read_only_dir(tmp_path):
    path = tmp_path / "read_only"
    path.mkdir(mode=0o555)
    if os.access(path, os.W_OK):  # root writes anyway; nobody creates directories in /proc
        return "/proc"
    return str(path)


@pytest.mark.parametrize("override, message", [
    ("stage.lr=-1", "infir-train: stage.lr=-1.0 is not valid: expected a positive number"),
    ("stage.foo=1", "infir-train: stage.foo is not a key of stage: expected one of name,"),
    ("model=qwen9", "infir-train: model=qwen9 is not valid: expected one of qwen2.5-0.5b,"),
])
def test_cli_reports_a_bad_config_in_one_line_with_exit_code_2(override, message, tmp_path):
    proc = run_train([override, f"run_dir={tmp_path / 'run'}"], check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "run").exists()


def test_cli_refuses_a_read_only_run_dir_in_one_line(read_only_dir):
    run_dir = f"{read_only_dir}/run"
    proc = run_train([f"run_dir={run_dir}"], check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"infir-train: run_dir='{run_dir}' is not valid: expected a directory this process can write")
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_missing_data_source_is_named_before_training(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    proc = run_train(["data=custom", f"data.tokenizer={tok}", "data.sources.pretrain=null", f"run_dir={tmp_path / 'run'}"], check=False)
    assert proc.returncode == 2
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
