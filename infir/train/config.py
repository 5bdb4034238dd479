"""Checks of a composed config that fail before any process group, model or data is built.

Hydra already rejects an unknown group option with the list of valid ones (`model=foo`); this module
catches wrong values inside a group, each error naming the key and what it accepts.
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue


class ConfigError(ValueError):
    pass


def _need(cond: bool, key: str, value, valid: str) -> None:
    if not cond:
        raise ConfigError(f"{key}={value!r} is not valid; expected {valid}")


COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def validate(cfg: DictConfig) -> None:
    from infir.model.qwen import SIZES, check_parallel
    from infir.train.precision import build_recipe

    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key} must be set (it is '???' in the config); pass {e.full_key}=...") from None
    st, tr = cfg.stage, cfg.train
    _need(cfg.model.name in SIZES, "model.name", cfg.model.name, f"one of {sorted(SIZES)}")
    try:
        build_recipe(cfg.precision)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _need(cfg.device in ("auto", "cpu", "cuda"), "device", cfg.device, "auto, cpu or cuda")
    _need(cfg.model.get("compile_mode", "auto") in COMPILE_MODES, "model.compile_mode", cfg.model.get("compile_mode"),
          f"one of {', '.join(COMPILE_MODES)} (auto, or one of torch.compile's modes)")
    _need(isinstance(cfg.parallel.tp, int) and cfg.parallel.tp >= 1, "parallel.tp", cfg.parallel.tp, "an integer >= 1")
    for key in ("seq_length", "global_batch", "micro_batch"):
        _need(isinstance(st[key], int) and st[key] > 0, f"stage.{key}", st[key], "a positive integer")
    _need(st.iters is None or (isinstance(st.iters, int) and st.iters > 0), "stage.iters", st.iters, "a positive integer or null (then stage.epochs)")
    _need(st.iters is not None or (st.epochs or 0) > 0, "stage.epochs", st.epochs, "a positive number when stage.iters is null")
    _need(st.schedule in ("cosine", "wsd", "constant"), "stage.schedule", st.schedule, "cosine, wsd or constant")
    _need(st.lr > 0 and 0 <= st.min_lr <= st.lr, "stage.min_lr", st.min_lr, f"between 0 and stage.lr={st.lr}")
    _need(tr.on_nan in ("stop", "skip"), "train.on_nan", tr.on_nan, "stop or skip")
    _need(tr.log_interval > 0, "train.log_interval", tr.log_interval, "a positive integer")
    _need(tr.save_interval > 0, "train.save_interval", tr.save_interval, "a positive integer")
    gci = tr.get("gc_interval")
    _need(gci is None or (isinstance(gci, int) and not isinstance(gci, bool) and gci >= 1), "train.gc_interval", gci,
          "null (Python's automatic garbage collection) or an integer >= 1 (collect every N steps)")
    _need(cfg.data.name in ("demo", "custom", "synthetic"), "data.name", cfg.data.name, "demo, custom or synthetic")
    _need(cfg.data.name != "synthetic" or st.dataset == "pretrain", "stage.dataset", st.dataset, "pretrain with data=synthetic")
    if cfg.data.name == "custom" and not (cfg.data.sources or {}).get(st.dataset):
        raise ConfigError(
            f"data.sources.{st.dataset} is not set: stage={st.name} reads the '{st.dataset}' source; "
            f"prepare it with `infir-prep` and pass data.sources.{st.dataset}=PREFIX (or a [weight, prefix, ...] blend)"
        )
    if cfg.init_from is not None:
        from pathlib import Path

        _need(Path(cfg.init_from).exists(), "init_from", cfg.init_from, "an existing checkpoint directory (or null)")
    try:
        check_parallel(SIZES[cfg.model.name], cfg.parallel.tp, st.seq_length, cfg.parallel.sequence_parallel)
    except ValueError as e:
        raise ConfigError(str(e)) from None
