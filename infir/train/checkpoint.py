"""Save and resume a training run: model shards + trainer state, committed atomically.

Layout and the atomic commit live in infir/model/ckpt_format.py (shared with infir-convert). Here:
what each rank writes. TP rank r of data-parallel rank 0 writes model shard r and the optimizer state
of its shard when it is replicated across DP; sharded (ZeRO-1), every data-parallel rank writes its
share; every rank writes its RNG state. Rank 0 writes meta.json and
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
from infir.train.config import ConfigError


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


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (full disk, quota, lost mount); the last committed one is intact."""


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

    def write_rank_files():
        if info.dp_rank == 0 and info.cp_rank == 0:  # the other DP and CP ranks hold the same shard
            fmt.save_shard(tmp, info.tp_rank, fmt.model_state(model))
            replicated = {} if optimizer.sharded else {"optimizer": optimizer.state_dict()}
            torch.save({**replicated, **trainer_state}, tmp / f"train_tp{info.tp_rank}.pt")
        if optimizer.sharded:  # every data-parallel rank holds its own share of the states
            torch.save(optimizer.state_dict(), tmp / _optimizer_shard_file(info, optimizer))
        torch.save(_rng_state(), tmp / f"rng_rank{info.rank}.pt")

    # In place of barriers: every rank learns whether any write failed, so none waits forever on one
    # that raised, and the uncommitted directory is dropped before the error reaches the user.
    _stop_if_any_failed(_attempt(write_rank_files), info, tmp, final)

    def commit():  # rank 0; `latest` moves last, so a failure anywhere here leaves the previous checkpoint named
        fmt.write_meta(tmp, {**meta, "iteration": iteration, "tp": info.tp, "world_size": info.world_size})
        fmt.commit(tmp, final)
        _prune(ckpt_root, keep_last)

    _stop_if_any_failed(_attempt(commit) if info.is_main else None, info, tmp, final)
    return final


def _attempt(write) -> BaseException | None:
    try:
        write()
    # Any exception: torch's zip writer reports a full disk as a RuntimeError ("unexpected pos"),
    # safetensors as its own error type; whatever it is, the other ranks must hear of it.
    except Exception as e:
        return e
    return None


def _stop_if_any_failed(error: BaseException | None, info, tmp: Path, final: Path) -> None:
    flag = torch.tensor([float(error is not None)], device=info.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() == 0:
        return
    written = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) if tmp.exists() else 0
    dist.barrier()  # every rank has stopped writing before the directory goes
    if info.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    raise CheckpointWriteError(write_failure_message(final, error, written)) from error


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def write_failure_message(final: Path, error: BaseException | None, written: int) -> str:
    root = final.parent
    latest = root / fmt.LATEST
    kept = (f"the last complete checkpoint, {root / latest.read_text().strip()}, is untouched and a rerun resumes from it"
            if latest.exists() else "no earlier checkpoint exists in this run")
    cause = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}" if error is not None else "another rank's write failed"
    free = shutil.disk_usage(root).free
    return (f"could not write checkpoint {final.name} in {root} ({cause}). The disk there has {_size(free)} free "
            f"after {_size(written)} of this checkpoint were written, now deleted. Free space (older runs, "
            f"train.keep_last) or give run_dir a larger disk; {kept}.")


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
        raise ConfigError(
            f"{iter_dir} was written with tp={meta['tp']} but this run has parallel.tp={info.tp}; "
            f"reshard it with `infir-convert mcore-to-hf` then `infir-convert hf-to-mcore --tp {info.tp}`"
        )
    state = fmt.load_shard(iter_dir, info.tp_rank)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(f"{iter_dir} does not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]} (is model= the same size?)")
    return meta


def _optimizer_shard_file(info, optimizer) -> str:
    return f"optim_tp{info.tp_rank}_dp{optimizer.shard_rank}.pt"


def _load_if(path: Path):
    return torch.load(path, map_location="cpu", weights_only=False) if path.exists() else None


def load_trainer(iter_dir: Path, optimizer, info) -> dict:
    """The optimizer's states (replicated, or this rank's share) and the trainer state of `iter_dir`. States
    written at another data-parallel size, bucket size or with(out) sharding are re-cut to this run's."""
    iter_dir = Path(iter_dir)
    state = torch.load(iter_dir / f"train_tp{info.tp_rank}.pt", map_location="cpu", weights_only=False)
    replicated = state.pop("optimizer", None)
    own = replicated if replicated is not None else _load_if(iter_dir / _optimizer_shard_file(info, optimizer))
    if own is not None and optimizer.layout_matches(own):
        optimizer.load_state_dict(own)
    else:
        saved = [replicated] if replicated is not None else [
            torch.load(f, map_location="cpu", weights_only=False) for f in sorted(iter_dir.glob(f"optim_tp{info.tp_rank}_dp*.pt"))]
        if not saved:
            raise ConfigError(f"{iter_dir} holds no optimizer states for tensor-parallel rank {info.tp_rank} "
                              f"(train_tp{info.tp_rank}.pt or optim_tp{info.tp_rank}_dp*.pt): it is incomplete; resume from an earlier one")
        try:
            optimizer.load_resharded(saved)
        except ValueError as e:  # saved ranges that do not join: files of two runs, or a truncated one
            raise ConfigError(f"the optimizer states in {iter_dir} do not fit together ({e}); resume from an "
                              f"earlier checkpoint") from e
    rng = Path(iter_dir) / f"rng_rank{info.rank}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    return state
