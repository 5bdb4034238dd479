"""The datasets a stage trains on, from the `data` config group (demo | custom | synthetic).

`data.sources` maps a stage's dataset name (stage.dataset: pretrain | sft1 | sft2) to an indexed-dataset
prefix, a blend [weight, prefix, ...], or a resolved mixture file (`infir-prep mixture`), whose phases
run in order (infir.data.pretrain returns them as one dataset marked `sequential`: the trainer's
sampler then reads it in order instead of permuting it).
"""
from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from infir.train.synthetic import RandomTokens


def tokenizer_dir(cfg) -> Path | None:
    if cfg.data.name == "synthetic":
        return None
    if cfg.data.tokenizer:
        path = Path(cfg.data.tokenizer)
        if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
            raise FileNotFoundError(f"data.tokenizer={path} is not a HF tokenizer directory (no tokenizer.json / tokenizer_config.json there)")
        return path
    from infir.data import DEMO_TOKENIZER

    return Path(DEMO_TOKENIZER)


def _sources(cfg, info) -> tuple[object, object]:
    """(train source, validation source) of the stage's dataset: a prefix, a blend list, or a mixture file."""
    name = cfg.stage.dataset
    if cfg.data.name == "demo":
        from infir.data.demo import ensure_demo_data

        if info.is_main:
            ensure_demo_data(Path(cfg.data.root).resolve())
        dist.barrier()
        paths = ensure_demo_data(Path(cfg.data.root).resolve())
        return paths[name], paths.get(f"{name}_valid")
    sources = cfg.data.sources or {}
    if name not in sources or sources[name] in (None, "???"):
        raise ValueError(f"data.sources.{name} is not set: stage={cfg.stage.name} reads the '{name}' source; prepare it with `infir-prep` and pass data.sources.{name}=PREFIX")
    return sources[name], cfg.data.valid


def _blend(src):
    """A prefix stays a prefix; an OmegaConf list [w, prefix, ...] becomes a plain list."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(src) if OmegaConf.is_config(src) else src


def order_keys(cfg) -> dict:
    """The config values the order of the training samples depends on, by key: the seed of the
    permutation, the global batch (step s reads samples s x global_batch on), and for pretraining
    stage.iters (megatron draws stage.iters x global_batch sequences: the blend's and the phases' sizes)."""
    keys = {"seed": cfg.seed, "stage.global_batch": cfg.stage.global_batch}
    if cfg.stage.dataset == "pretrain" and cfg.data.name != "synthetic":
        keys["stage.iters"] = cfg.stage.iters
    return keys


def build_data(cfg, info, vocab: int):
    """(train dataset, validation dataset or None) for this stage.

    Pretraining draws `stage.iters x stage.global_batch` sequences (megatron repeats epochs of a
    weighted blend as needed); SFT datasets are epochs of packed samples.
    """
    seq = cfg.stage.seq_length
    if cfg.data.name == "synthetic":
        docs = cfg.data.synthetic_doc_median
        return (RandomTokens(vocab, seq, seed=cfg.seed, doc_median=docs),
                RandomTokens(vocab, seq, num_samples=4096, seed=cfg.seed + 1, doc_median=docs))
    train_src, valid_src = _sources(cfg, info)
    tok = tokenizer_dir(cfg)
    if cfg.stage.dataset == "pretrain":
        from infir.data.pretrain import build_pretrain_datasets

        if not cfg.stage.iters:
            raise ValueError("stage.iters must be set for pretraining stages (stage.epochs applies to SFT)")
        valid_samples = cfg.train.eval_iters * cfg.stage.micro_batch * info.dp
        return build_pretrain_datasets(
            _blend(train_src), seq_length=seq, tokenizer=tok, valid_blend=_blend(valid_src) if valid_src else None,
            train_samples=cfg.stage.iters * cfg.stage.global_batch, valid_samples=max(valid_samples, 1), seed=cfg.seed,
            cache_dir=Path(cfg.run_dir) / "data_cache", reset_at_eod=cfg.data.reset_attention_at_eod,
        )
    from infir.data.sft import build_sft_dataset

    train = build_sft_dataset(train_src, seq_length=seq)
    valid = build_sft_dataset(valid_src, seq_length=seq) if valid_src else None
    return train, valid
