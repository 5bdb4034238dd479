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


def test_tp2_overlaps_its_collectives_by_default_and_leaves_it_inert_without_sequence_parallelism():
    """parallel.tp_comm_overlap splits the sequence-parallel collectives: tp2 turns it on, and turning sequence
    parallelism off needs nothing more (there is nothing to split; megatron's config keeps it off)."""
    from infir.model.qwen import get_size, transformer_config

    cfg = compose(["parallel=tp2"])
    validate(cfg)
    assert cfg.parallel.tp_comm_overlap is True and cfg.parallel.sequence_parallel is True
    cfg = compose(["parallel=tp2", "parallel.sequence_parallel=false"])
    validate(cfg)
    tcfg = transformer_config(get_size("tiny"), tp=2, sequence_parallel=False, tp_comm_overlap=cfg.parallel.tp_comm_overlap)
    assert tcfg.tp_comm_overlap is False


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


# --------------------------------------------------------------------------- data paths, checked at config time
@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A tiny pretraining dataset and a tiny SFT dataset, as `infir-prep` writes them."""
    import json

    from infir.data import DEMO_TOKENIZER
    from infir.data.sft import prepare_sft
    from infir.data.tokenize_corpus import tokenize_to_indexed

    root = tmp_path_factory.mktemp("prepared")
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(20)))
    tokenize_to_indexed([root / "docs.jsonl"], root / "pretrain", DEMO_TOKENIZER, progress=False)
    (root / "chat.jsonl").write_text(json.dumps({"prompt": "2+2?", "response": "4"}) + "\n")
    prepare_sft(root / "chat.jsonl", root / "sft", DEMO_TOKENIZER, seq_length=64, progress=False)
    return root


def _custom(*overrides):
    from infir.data import DEMO_TOKENIZER

    return ["data=custom", f"data.tokenizer={DEMO_TOKENIZER}", *overrides]


def _damaged(prepared, tmp_path, name: str, damage) -> str:
    import shutil

    for suffix in (".bin", ".idx"):
        shutil.copy(prepared / f"pretrain{suffix}", tmp_path / f"pretrain{suffix}")
    damage(tmp_path / f"pretrain{name}")
    return str(tmp_path / "pretrain")


def test_a_stage_needs_only_its_own_source(prepared):
    validate(compose(_custom("stage=sft1", f"data.sources.sft1={prepared / 'sft'}")))
    validate(compose(_custom(f"data.sources.pretrain={prepared / 'pretrain'}")))
    blend = f"data.sources.pretrain=[0.3,{prepared / 'pretrain'},0.7,{prepared / 'pretrain'}]"
    validate(compose(_custom(blend)))
    with pytest.raises(ConfigError, match=r"^data.sources.sft2 is not set: stage=sft2 reads the 'sft2' source"):
        validate(compose(_custom("stage=sft2", f"data.sources.pretrain={prepared / 'pretrain'}")))


@pytest.mark.parametrize("name, damage, problem", [
    (".bin", lambda p: p.unlink(), "pretrain.bin is missing"),
    (".idx", lambda p: p.write_bytes(p.read_bytes()[:30]), "pretrain.idx is not a megatron index (truncated or corrupt)"),
    (".idx", lambda p: p.write_bytes(p.read_bytes()[:-8]), "pretrain.idx is truncated or corrupt"),
    (".bin", lambda p: p.write_bytes(p.read_bytes()[:-2]), "pretrain.bin holds"),
    (".idx", lambda p: p.write_bytes(b"garbage" * 10), "pretrain.idx is not a megatron index"),
], ids=["bin missing", "idx truncated in its header", "idx truncated", "bin truncated", "idx corrupt"])
def test_a_missing_or_damaged_dataset_names_the_key_and_the_file(prepared, tmp_path, name, damage, problem):
    prefix = _damaged(prepared, tmp_path, name, damage)
    with pytest.raises(ConfigError) as e:
        validate(compose(_custom(f"data.sources.pretrain={prefix}")))
    message = str(e.value)
    assert message.startswith(f"data.sources.pretrain='{prefix}' is not valid: expected an indexed-dataset prefix")
    assert problem in message and "\n" not in message, message


@pytest.mark.parametrize("overrides, message", [
    (["data.sources.pretrain=/nonexistent/prefix"],
     "data.sources.pretrain='/nonexistent/prefix' is not valid: expected an indexed-dataset prefix from `infir-prep "
     "pretrain`, a [weight, prefix, ...] blend or a mixture file from `infir-prep mixture` (/nonexistent/prefix.bin "
     "and /nonexistent/prefix.idx are missing)"),
    (["data.sources.pretrain=[0.5,/nonexistent/a]"], "data.sources.pretrain=[0.5, '/nonexistent/a'] is not valid"),
    (["data.sources.pretrain=[1,2,3]"], "data.sources.pretrain=[1, 2, 3] is not valid: expected an indexed-dataset prefix"),
    (["data.sources.pretrain=/nonexistent/mix.yaml"], "data.sources.pretrain='/nonexistent/mix.yaml' is not valid"),
    (["stage=sft1", "data.sources.sft1=/nonexistent/sft"], "data.sources.sft1='/nonexistent/sft' is not valid: "
     "expected a prefix from `infir-prep sft` (/nonexistent/sft.bin and /nonexistent/sft.idx are missing)"),
    (["data.tokenizer=/nonexistent/tok"], "data.tokenizer='/nonexistent/tok' is not valid: expected an HF tokenizer "
     "directory holding tokenizer.json"),
    (["stage.iters=null", "stage.epochs=1"], "stage.iters=None is not valid: expected a positive integer for a "
     "pretraining stage"),
], ids=["missing prefix", "missing blend prefix", "not a blend", "missing mixture", "missing sft prefix",
        "not a tokenizer", "pretraining without iters"])
def test_data_keys_are_checked_before_anything_is_built(prepared, overrides, message):
    if not any(o.startswith("data.sources.") for o in overrides):
        overrides = [*overrides, f"data.sources.pretrain={prepared / 'pretrain'}"]
    with pytest.raises(ConfigError) as e:
        validate(compose(_custom(*overrides)))
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_the_valid_source_an_sft_source_without_its_masks_and_a_bad_mixture_are_named(prepared, tmp_path):
    pretrain = prepared / "pretrain"
    with pytest.raises(ConfigError, match=r"^data.valid='/nonexistent/v' is not valid: .*\(/nonexistent/v.bin"):
        validate(compose(_custom(f"data.sources.pretrain={pretrain}", "data.valid=/nonexistent/v")))
    with pytest.raises(ConfigError, match=rf"^data.sources.sft1='{pretrain}' .*\({pretrain}.lossmask.bin and"):
        validate(compose(_custom("stage=sft1", f"data.sources.sft1={pretrain}")))
    (tmp_path / "mix.yaml").write_text("phases: [{name: a}]\n")
    with pytest.raises(ConfigError, match=r"mix.yaml is not a resolved mixture file \(KeyError: 'tokens'\)"):
        validate(compose(_custom(f"data.sources.pretrain={tmp_path / 'mix.yaml'}")))


def test_init_from_must_be_a_readable_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt" / "iter_0000000"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text('{"format": "infir-mcore-v1", "tp": ')
    with pytest.raises(ConfigError, match=rf"^init_from='{ckpt}' is not valid: expected an infir checkpoint .*"
                                          r"meta.json is not valid JSON"):
        validate(compose([f"init_from={ckpt}"]))


def test_cli_names_a_bad_data_path_in_one_line_without_a_traceback(tmp_path, monkeypatch, capsys):
    from infir.train.cli import main

    run_dir = tmp_path / "run"
    monkeypatch.setattr("sys.argv", ["infir-train", *_custom("data.sources.pretrain=/nonexistent/prefix"),
                                     f"run_dir={run_dir}"])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("infir-train: data.sources.pretrain='/nonexistent/prefix' is not valid")
    assert not run_dir.exists()
