"""A bad config fails before any process group, model or data is built, in one line that names the key,
the rule and the valid values.

Each group's fields are typed and range-checked by its dataclass (schema.py): Hydra rejects an
unknown key or a wrong type while composing, `typed` runs the range checks. `validate` adds the
rules that span groups and the ones that look at the disk (the stage's data, the tokenizer,
init_from, run_dir).
"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue


class ConfigError(ValueError):
    pass


def check(cond: bool, key: str, value, valid: str) -> None:
    """Raise a ConfigError naming `key` and what it accepts unless `cond` holds."""
    if not cond:
        raise ConfigError(f"{key}={value!r} is not valid: expected {valid}")


def typed(cfg: DictConfig):
    """The config as its schema's dataclasses (schema.InfirConfig): every field's own rule checked."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # the first unset key in the file's order
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key} must be set (it is '???' in the config); pass {e.full_key}=...") from None
    config = OmegaConf.to_object(cfg)
    _reject_unknown_keys(config)
    return config


def _reject_unknown_keys(config, prefix: str = "") -> None:
    """Hydra's `+key=value` adds a key even to a typed node, and to_object keeps it as an attribute:
    a key the dataclass does not declare is a typo."""
    names = [f.name for f in dataclasses.fields(config)]
    for key in vars(config):
        if key not in names:
            raise _unknown_key(prefix + key, names)
    for name in names:
        value = getattr(config, name)
        if dataclasses.is_dataclass(value):
            _reject_unknown_keys(value, f"{prefix}{name}.")


def _unknown_key(full_key: str, valid) -> ConfigError:
    parent = full_key.rpartition(".")[0] or "the config"
    return ConfigError(f"{full_key} is not a key of {parent}: expected one of {', '.join(map(str, valid))}")


def composition_error(error: Exception) -> ConfigError:
    """Hydra's multi-line report of a failed composition, as one ConfigError line."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    if isinstance(error, MissingConfigException) and error.options:
        group, _, option = (error.missing_cfg_file or "").rpartition("/")
        return ConfigError(f"{group}={option} is not valid: expected one of {', '.join(error.options)} (conf/{group}/)")
    cause = error.__cause__ or error.__context__  # an override's error, or a YAML file's
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key:
        node = cause.parent_node
        keys = [k for k in node.keys() if k != "hydra"] if node is not None else ["the keys in conf/"]
        return _unknown_key(cause.full_key, keys)
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        return ConfigError(f"{cause.full_key}={cause.value!r} is not valid: expected {_declared_type(cause)}")
    return ConfigError(" ".join(line.strip() for line in str(error).splitlines() if line.strip()))


_WORDS = {"float": "a number", "int": "an integer", "bool": "true or false", "str": "a string",
          "List[float]": "a list of numbers", "Dict[str, Any]": "a mapping of names to values"}


def _declared_type(error) -> str:
    """In words, the type schema.py declares for the key an OmegaConf ValidationError names."""
    owner = error.object_type
    if dataclasses.is_dataclass(owner):
        declared = {f.name: str(f.type) for f in dataclasses.fields(owner)}.get(error.key, "")
    else:  # an item of a typed list: typing.List[float]
        declared = str(error.ref_type).removeprefix("typing.List[").removesuffix("]")
    optional = declared.startswith("Optional[")
    if optional:
        declared = declared.removeprefix("Optional[").removesuffix("]")
    words = _WORDS.get(declared) or (f"a mapping of {declared}'s keys" if declared else "a value of the declared type")
    return words + (" or null" if optional else "")


def _writable(run_dir: Path) -> str | None:
    """Why run_dir cannot be made or written to, or None when it can."""
    existing = run_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file"
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as e:
        return f"cannot create a directory in {existing}: {e.strerror}"
    return None


def _check_data(cfg: DictConfig) -> None:
    """The stage reads its own source only; that source, data.valid and data.tokenizer hold what
    training reads (infir.data.checks looks at headers and sizes, reading no data)."""
    from infir.data.checks import source_problem

    st = cfg.stage
    check(cfg.data.name != "synthetic" or st.dataset == "pretrain", "stage.dataset", st.dataset,
          "pretrain with data=synthetic")
    check(st.dataset != "pretrain" or st.iters is not None, "stage.iters", st.iters,
          "a positive integer for a pretraining stage (stage.epochs applies to SFT stages)")
    if cfg.data.tokenizer is not None:
        check((Path(cfg.data.tokenizer) / "tokenizer.json").is_file(), "data.tokenizer", cfg.data.tokenizer,
              "an HF tokenizer directory holding tokenizer.json (Qwen2.5's model directory), or null for the demo's")
    if cfg.data.name != "custom":
        return
    source = (cfg.data.sources or {}).get(st.dataset)
    sft = st.dataset != "pretrain"
    if not source:
        raise ConfigError(
            f"data.sources.{st.dataset} is not set: stage={st.name} reads the '{st.dataset}' source; prepare it with "
            f"`infir-prep {'sft' if sft else 'pretrain'}` and pass data.sources.{st.dataset}=PREFIX"
            + ("" if sft else " (or a [weight, prefix, ...] blend)")
        )
    for key, value in ((f"data.sources.{st.dataset}", source), ("data.valid", cfg.data.valid)):
        if value is not None:
            value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            problem = source_problem(value, sft=sft)
            check(problem is None, key, value, f"{_SOURCE_KINDS[sft]} ({problem})")


_SOURCE_KINDS = {
    False: "an indexed-dataset prefix from `infir-prep pretrain`, a [weight, prefix, ...] blend or a mixture file "
           "from `infir-prep mixture`",
    True: "a prefix from `infir-prep sft`",
}


def _checkpoint_problem(path: str) -> str | None:
    """Why `path` is not a checkpoint whose weights can start a run, or None."""
    from infir.model import ckpt_format

    try:
        iter_dir = ckpt_format.resolve(path)
        ckpt_format.check_shards(iter_dir, ckpt_format.read_meta(iter_dir)["tp"])
    except (FileNotFoundError, ValueError) as e:
        return str(e)
    return None


def _check_grad_release(cfg: DictConfig) -> None:
    """optimizer.grad_release steps each parameter inside backward: nothing may need every gradient first."""
    from infir.optim import OPTIMIZERS, PerParamOptimizer

    why = "with optimizer.grad_release=true"
    per_param = [name for name, spec in OPTIMIZERS.items()
                 if isinstance(spec.factory, type) and issubclass(spec.factory, PerParamOptimizer)]
    check(cfg.optimizer.name in per_param, "optimizer", cfg.optimizer.name,
          f"one of {', '.join(per_param)} {why} (they step one parameter at a time)")
    check(not cfg.stage.grad_clip, "stage.grad_clip", cfg.stage.grad_clip,
          f"0 {why}: clipping needs the norm of every gradient before the first update")
    check(cfg.train.spike.action == "none", "train.spike.action", cfg.train.spike.action,
          f"none {why}: a spike is only seen once every parameter has stepped")
    check(cfg.parallel.tp == 1 and cfg.parallel.cp == 1, "parallel.tp x parallel.cp", cfg.parallel.tp * cfg.parallel.cp,
          f"1 {why}: gradients reduced across ranks arrive after the parameters have stepped")
    check(not cfg.optimizer.distributed, "optimizer.distributed", cfg.optimizer.distributed,
          f"null or false {why} (one rank)")


def validate(cfg: DictConfig) -> None:
    """The field rules (typed) plus those across groups and on the disk; ConfigError at the first broken one."""
    from infir.model.qwen import SIZES, check_parallel

    typed(cfg)
    st = cfg.stage
    _check_data(cfg)
    if cfg.init_from is not None:
        problem = _checkpoint_problem(cfg.init_from)
        check(problem is None, "init_from", cfg.init_from, f"an infir checkpoint or run directory, or null ({problem})")
    problem = _writable(Path(cfg.run_dir))
    check(problem is None, "run_dir", cfg.run_dir, f"a directory this process can write ({problem})")
    try:
        check_parallel(SIZES[cfg.model.name], cfg.parallel.tp, st.seq_length, cfg.parallel.sequence_parallel, cfg.parallel.cp)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.optimizer.grad_release:
        _check_grad_release(cfg)
    if cfg.optimizer.fp8_param_gather:
        from infir.train.fp8_param_gather import gathers_in_fp8
        from infir.train.precision import build_recipe

        check(gathers_in_fp8(build_recipe(cfg.precision)), "optimizer.fp8_param_gather", True,
              f"false with precision={cfg.precision.name}: only recipes with 128x128 weight blocks scaled from "
              "their amax (fp8_blockwise_*) gather FP8 weights")
