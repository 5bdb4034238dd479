"""Save and resume a training run: model shards + trainer state, committed atomically, written in the
background; resumed at any tensor- and data-parallel layout.

Layout and the atomic commit live in infir/model/ckpt_format.py (shared with infir-convert). Here:
what each rank writes (`_rank_files`), how (`PendingSave`: host copies written by a thread while training
goes on; rank 0 writes meta.json and commits once every rank's files are on disk, so `latest` only ever
names a complete checkpoint), and how a resume reads them back: as written, re-cut to another
data-parallel layout (DataParallelOptimizer.load_resharded), or to another tensor-parallel size (reshard.py).
"""
from __future__ import annotations

import copy
import pickle
import random
import shutil
import threading
import weakref
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


def save(ckpt_root: Path, iteration: int, *, model, optimizer, trainer_state: dict, meta: dict, info, keep_last: int,
         staging: "HostStaging | None" = None) -> "PendingSave":
    """Write checkpoint `iteration`: with `staging`, in a background thread from host copies of the files'
    tensors (queued now, made beside the next step's compute); without, here. `wait()` on the returned save,
    on every rank together, ends it: CheckpointWriteError if any rank's write failed."""
    ckpt_root = Path(ckpt_root)
    final = ckpt_root / fmt.iter_dir_name(iteration)
    tmp = ckpt_root / (final.name + ".tmp")
    if info.is_main:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        for stale in ckpt_root.glob("iter_*.tmp"):  # left by a crash or an abandoned save: never committed
            shutil.rmtree(stale)
        tmp.mkdir()
    dist.barrier()
    files = _rank_files(model, optimizer, trainer_state, info)
    meta = {**meta, "iteration": iteration, "tp": info.tp, "world_size": info.world_size, "param_names": optimizer.param_names}

    def commit():  # rank 0; `latest` moves last, so a failure anywhere here leaves the previous checkpoint named
        fmt.write_meta(tmp, meta)
        fmt.commit(tmp, final)
        _prune(ckpt_root, keep_last)

    if staging is None:
        pending = PendingSave(tmp, final, info, files, commit)
        pending.run()
    else:
        pending = PendingSave(tmp, final, info, staging.copy(files), commit, staging.copied)
        pending.start()
    return pending


def _rank_files(model, optimizer, trainer_state: dict, info) -> dict[str, object]:
    """What this rank writes, by file name. TP rank r of data-parallel rank 0 writes model shard r and, where
    the states are replicated across DP, the optimizer's; sharded (ZeRO-1), every data-parallel rank
    writes its share; every rank writes its RNG state."""
    files = {}
    if info.dp_rank == 0 and info.cp_rank == 0:  # the other DP and CP ranks hold the same shard
        files[fmt.shard_name(info.tp_rank)] = fmt.model_tensors(model)
        replicated = {} if optimizer.sharded else {"optimizer": optimizer.state_dict()}
        files[f"train_tp{info.tp_rank}.pt"] = {**replicated, **trainer_state}
    if optimizer.sharded:  # every data-parallel rank holds its own share of the states
        files[_optimizer_shard_file(info, optimizer)] = optimizer.state_dict()
    files[f"rng_rank{info.rank}.pt"] = _rng_state()
    return files


def reserve(staging: "HostStaging", *, model, optimizer, info) -> int:
    """Make `staging`'s host buffers for this rank's files ahead of its first save (once the optimizer's states
    exist); their bytes."""
    return staging.reserve(_rank_files(model, optimizer, {}, info))


def write_file(path: Path, content) -> None:
    if path.suffix == ".safetensors":
        fmt.save_tensors(path, content)
    else:
        torch.save(content, path)


class HostStaging:
    """Host buffers a save's tensors are copied into, so that training goes on while a thread writes them.
    Kept from save to save (a run saves the same tensors each time): pinned memory is slow to allocate,
    and on CUDA the copies from it run at the link's full speed. There they run on a stream of their own,
    beside the next step's forward and backward, which only read what is saved: the step waits for them
    (on the GPU, the host going on) only where it first writes those tensors (`before_writes`)."""

    def __init__(self, device: torch.device | None = None):
        self._buffers: list[torch.Tensor] = []
        self._is_pinned: list[bool] = []  # each buffer's kind (registered memory need not report is_pinned())
        self._used, self._memo, self._storages = 0, {}, {}
        self._copying = True  # False while reserve() walks a tree: buffers made, nothing copied
        # the copies' own stream, where the saved tensors live on a GPU (`device`)
        self.stream = torch.cuda.Stream(device) if device is not None and device.type == "cuda" else None
        self.copied: torch.cuda.Event | None = None  # the end of the last copy, until the next write waits for it

    def copy(self, tree):
        """`tree` (dicts, lists and tuples of tensors and plain values) with every tensor copied to host memory:
        at once without a stream; with one, queued on it behind the work queued so far, and done at `copied`."""
        self._used, self._memo, self._storages = 0, {}, {}
        if self.stream is None:
            out = self._copy(tree)
        else:
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                out = self._copy(tree)
            self.copied = torch.cuda.Event()
            self.copied.record(self.stream)
        self._memo, self._storages = {}, {}
        return out

    def reserve(self, tree) -> int:
        """Make, ahead of a save, the host buffers copy(tree) will use (a tree of the same tensor sizes); their
        bytes. Pinning takes seconds for tens of GiB, which the first save would otherwise stall training for."""
        self._used, self._memo, self._storages, self._copying = 0, {}, {}, False
        try:
            self._copy(tree)
        finally:
            self._memo, self._storages, self._copying = {}, {}, True
        return sum(b.numel() for b in self._buffers[:self._used])

    def before_writes(self) -> None:
        """Before work that writes in place a tensor the last save copied (the optimizer step): the GPU
        runs it once the copies are done."""
        if self.copied is not None:
            torch.cuda.current_stream().wait_event(self.copied)
            self.copied = None

    def _copy(self, tree):
        if id(tree) in self._memo:  # what the tree shares stays shared, as it is pickled (copy.deepcopy's memo)
            return self._memo[id(tree)]
        if torch.is_tensor(tree):
            out = self._tensor(tree)
        elif isinstance(tree, dict):
            out = {k: self._copy(v) for k, v in tree.items()}
        elif isinstance(tree, list):
            out = [self._copy(v) for v in tree]
        elif type(tree) is tuple:
            out = tuple(self._copy(v) for v in tree)
        else:  # RNG states, hyper-parameters: cheap to copy
            return copy.deepcopy(tree, self._memo)
        self._memo[id(tree)] = out
        return out

    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        """t on the host, as a view of the host copy of its storage: tensors that are views of one storage
        (a flat state buffer and its parameters' slices) stay views of one, so torch.save writes the same
        bytes as for the originals."""
        storage = t.untyped_storage()
        key = (storage.device, storage.data_ptr(), storage.nbytes())
        host = self._storages.get(key) if storage.nbytes() else None
        if host is None:
            host = self._buffer(storage.nbytes(), t.is_cuda)
            if self._copying:
                raw = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
                queued = raw.is_cuda and self.stream is not None
                if queued:  # a tensor made for the save (a state dict's) is not freed for reuse before its copy ran
                    raw.record_stream(self.stream)
                host.copy_(raw, non_blocking=queued)
            self._storages[key] = host
        return torch.empty(0, dtype=t.dtype).set_(host.untyped_storage(), t.storage_offset(), t.shape, t.stride())

    def _buffer(self, nbytes: int, pinned: bool) -> torch.Tensor:
        i, self._used = self._used, self._used + 1
        if i < len(self._buffers) and self._buffers[i].numel() == nbytes and self._is_pinned[i] == pinned:
            return self._buffers[i]
        buf = _pinned(nbytes) if pinned else torch.empty(nbytes, dtype=torch.uint8)
        self._buffers[i:i + 1], self._is_pinned[i:i + 1] = [buf], [pinned]
        return buf


def _pinned(nbytes: int) -> torch.Tensor:
    """`nbytes` of page-locked host memory, exactly: a plain allocation registered with CUDA, as
    torch.distributed.checkpoint's stager pins, because torch's pinned allocator rounds every block up to a
    power of two (a rank's share of a checkpoint could be held pinned up to twice over)."""
    buf = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        cudart = torch.cuda.cudart()
        err = int(cudart.cudaHostRegister(buf.data_ptr(), nbytes, 1))  # 1: cudaHostRegisterPortable
        if err:
            raise ConfigError(f"could not pin {_size(nbytes)} of host memory for train.async_save's checkpoint copies "
                              f"(cudaError {err}): free host memory, or set train.async_save=false")
        # unregistered when the buffer goes, not at exit (the CUDA context may be gone by then)
        weakref.finalize(buf, cudart.cudaHostUnregister, buf.data_ptr()).atexit = False
    return buf


class PendingSave:
    """One checkpoint's files, written by every rank (in a background thread, or at once), then committed.

    The ranks' threads do not talk to each other (a collective from a thread would race the training
    step's): each marks its files written (or failed) in the directory, and rank 0's commits once every
    rank's mark is there. `wait()`, on the main thread of every rank together, joins the thread and
    learns, with one collective, whether any rank failed."""

    def __init__(self, tmp: Path, final: Path, info, files: dict, commit, copied: "torch.cuda.Event | None" = None):
        self.tmp, self.final, self.info, self.files, self._commit = tmp, final, info, files, commit
        self.copied = copied  # where the files' tensors are host copies still being made: their end
        self.error: BaseException | None = None
        self._abandoned = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # daemon: a process that dies or is interrupted abandons the save (`latest` stays on the last complete one)
        self._thread = threading.Thread(target=self.run, name=f"infir-save-{self.final.name}", daemon=True)
        self._thread.start()

    def run(self) -> None:
        if self.copied is not None:
            self.copied.synchronize()
        self.error = _attempt(lambda: [write_file(self.tmp / name, content) for name, content in self.files.items()])
        self.files = None  # the host copies are the staging's; nothing else needs them
        # An empty file needs no data block: a full disk still takes the mark, and rank 0 hears of the failure.
        _attempt((self.tmp / f".{'failed' if self.error else 'written'}_rank{self.info.rank}").touch)
        if self.info.is_main and self.error is None:
            self.error = _attempt(self._commit_once_written)

    def _commit_once_written(self) -> None:
        marks = [self.tmp / f".written_rank{r}" for r in range(self.info.world_size)]
        while not all(m.exists() for m in marks):
            if any(self.tmp.glob(".failed_rank*")) or self._abandoned.wait(0.02):
                return  # the failing rank reports it at wait(); an abandoned save is never committed
        for m in marks:
            m.unlink()
        self._commit()

    def abandon(self) -> None:
        """Give the save up (the run stops on an error): rank 0 commits nothing more of it."""
        self._abandoned.set()

    def wait(self) -> Path:
        if self._thread is not None:
            self._thread.join()
        _stop_if_any_failed(self.error, self.info, self.tmp, self.final)
        return self.final


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
    """Load this TP rank's model weights: its shard, or, from a checkpoint written at another TP size,
    its piece of every tensor merged from all the shards (reshard.py)."""
    from infir.train import reshard

    meta = fmt.read_meta(iter_dir)
    same = meta["tp"] == info.tp
    state = _readable(lambda: fmt.load_shard(iter_dir, info.tp_rank) if same else reshard.weights(iter_dir, meta["tp"], info))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(f"{iter_dir} does not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]} (is model= the same size?)")
    return meta


def _readable(read):
    """read(), with a missing or corrupt checkpoint file (whose error names it and the fix) as a ConfigError."""
    try:
        return read()
    except ConfigError:
        raise
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from e


def _optimizer_shard_file(info, optimizer) -> str:
    return f"optim_tp{info.tp_rank}_dp{optimizer.shard_rank}.pt"


def _load(path: Path, mmap: bool = False):
    """A file of the checkpoint written by torch.save; a truncated or corrupt one is a ValueError naming it.
    `mmap`: its tensors mapped, read from disk where they are used (a re-cut reads its own parameters' only)."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the checkpoint is incomplete; copy the file back")
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as e:  # torch's zip reader, the pickle in it
        raise ValueError(f"{path} is not readable ({str(e).splitlines()[0][:120]}): it is truncated or corrupt; "
                         "write or copy it again") from None


def _saved_optimizer(iter_dir: Path, tp_rank: int, replicated: dict | None) -> list[dict]:
    """The optimizer state_dict()s every data-parallel rank of saved tensor-parallel rank `tp_rank` wrote
    (`replicated`: the one of its train file, when the states were not sharded)."""
    if replicated is not None:
        return [replicated]
    saved = [_load(f, mmap=True) for f in sorted(iter_dir.glob(f"optim_tp{tp_rank}_dp*.pt"))]
    if not saved:
        raise ConfigError(f"{iter_dir} holds no optimizer states for tensor-parallel rank {tp_rank} "
                          f"(train_tp{tp_rank}.pt or optim_tp{tp_rank}_dp*.pt): it is incomplete; resume from an earlier one")
    return saved


def load_trainer(iter_dir: Path, optimizer, info) -> dict:
    """The optimizer's states (replicated, or this rank's share) and the trainer state of `iter_dir`. States
    written at another data-parallel size, bucket size, with(out) sharding or at another tensor-parallel
    size are re-cut to this run's. Each rank takes its saved RNG state; a rank the saving run did not have
    keeps the one the run's seed gave it (deterministic)."""
    from infir.train import reshard

    iter_dir = Path(iter_dir)
    meta = fmt.read_meta(iter_dir)
    tp_saved = meta["tp"]
    state = _readable(lambda: _load(iter_dir / f"train_tp{info.tp_rank if tp_saved == info.tp else 0}.pt"))
    replicated = state.pop("optimizer", None)
    if tp_saved != info.tp:
        def read_all():
            trains = [replicated] + [_load(iter_dir / f"train_tp{r}.pt", mmap=True).get("optimizer") for r in range(1, tp_saved)]
            return [_saved_optimizer(iter_dir, r, sd) for r, sd in enumerate(trains)]

        saved = _readable(read_all)
        _fitting(lambda: reshard.optimizer_states(optimizer, saved, meta.get("param_names"), info), iter_dir)
    else:
        own = replicated if replicated is not None else _readable(lambda: _load_if(iter_dir / _optimizer_shard_file(info, optimizer)))
        if own is not None and optimizer.layout_matches(own):
            optimizer.load_state_dict(own)
        else:
            saved = _readable(lambda: _saved_optimizer(iter_dir, info.tp_rank, replicated))
            _fitting(lambda: optimizer.load_resharded(saved), iter_dir)
    rng = iter_dir / f"rng_rank{info.rank}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    return state


def _load_if(path: Path):
    return _load(path) if path.exists() else None


def _fitting(load, iter_dir: Path) -> None:
    try:
        load()
    except ConfigError:
        raise
    except ValueError as e:  # saved ranges that do not join: files of two runs, or a truncated one
        raise ConfigError(f"the optimizer states in {iter_dir} do not fit together ({e}); resume from an "
                          f"earlier checkpoint") from e
