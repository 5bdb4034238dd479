"""Save and resume a training run: model shards + trainer state, committed atomically.

Layout and the atomic commit live in infir/model/ckpt_format.py (shared with infir-convert). Here:
what each rank writes. TP rank r of data-parallel rank 0 writes model shard r and the optimizer state
of its shard (replicated across DP); every rank writes its RNG state. Rank 0 writes meta.json and
commits once all ranks are done (two barriers), so `latest` only ever names a complete checkpoint.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from infir.model import ckpt_format as fmt


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(ckpt_root: Path, iteration: int, *, model, optimizer, trainer_state: dict, meta: dict, info, keep_last: int) -> Path:
    ckpt_root = Path(ckpt_root)
    final = ckpt_root / fmt.iter_dir_name(iteration)
    tmp = ckpt_root / (final.name + ".tmp")
    if info.is_main:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # left by a crash during an earlier save: never committed, safe to drop
            shutil.rmtree(tmp)
        tmp.mkdir()
    dist.barrier()
    if info.dp_rank == 0:
        fmt.save_shard(tmp, info.tp_rank, fmt.model_state(model))
        torch.save({"optimizer": optimizer.state_dict(), **trainer_state}, tmp / f"train_tp{info.tp_rank}.pt")
    torch.save(_rng_state(), tmp / f"rng_rank{info.rank}.pt")
    dist.barrier()
    if info.is_main:
        fmt.write_meta(tmp, {**meta, "iteration": iteration, "tp": info.tp, "world_size": info.world_size})
        fmt.commit(tmp, final)
        _prune(ckpt_root, keep_last)
    dist.barrier()
    return final


def _prune(root: Path, keep_last: int) -> None:
    done = sorted(p for p in root.glob("iter_*") if p.is_dir() and not p.name.endswith(".tmp"))
    latest = (root / fmt.LATEST).read_text().strip()
    for p in done[:-keep_last] if keep_last > 0 else []:
        if p.name != latest:
            shutil.rmtree(p, ignore_errors=True)


def find_resume(ckpt_root: Path) -> Path | None:
    return fmt.resolve(ckpt_root) if (Path(ckpt_root) / fmt.LATEST).exists() else None


def load_weights(iter_dir: Path, model, info) -> dict:
    """Load this TP rank's model shard; the checkpoint must have been written at the same TP size."""
    meta = fmt.read_meta(iter_dir)
    if meta["tp"] != info.tp:
        raise ValueError(
            f"{iter_dir} was written with tp={meta['tp']} but this run has parallel.tp={info.tp}; "
            f"reshard it with `infir-convert mcore-to-hf` then `infir-convert hf-to-mcore --tp {info.tp}`"
        )
    state = fmt.load_shard(iter_dir, info.tp_rank)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(f"{iter_dir} does not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]} (is model= the same size?)")
    return meta


def load_trainer(iter_dir: Path, optimizer, info) -> dict:
    state = torch.load(Path(iter_dir) / f"train_tp{info.tp_rank}.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state.pop("optimizer"))
    rng = Path(iter_dir) / f"rng_rank{info.rank}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    return state
