"""On-disk layout of an infir megatron checkpoint, shared by the trainer and `infir-convert`.

    RUN/checkpoints/
      latest                      text: the name of the newest *complete* iteration directory
      iter_0000100/
        meta.json                 format, iteration, tp size, model size fields, tokenizer, config, and
                                  param_names (the optimizer's parameters, in the order its states index them)
        model_tp0.safetensors     tensor-parallel shard r of the megatron state dict (no _extra_state)
        model_tp1.safetensors
        train_tp*.pt              trainer state (step, spike window; the optimizer's when replicated over DP)
        optim_tp*_dp*.pt          each data-parallel rank's share of the optimizer states (ZeRO-1)
        rng_rank*.pt              each rank's RNG states
                                  (train, optim and rng files are absent in converted checkpoints, which
                                  then start a fresh run from these weights)

Why our own layout rather than megatron's dist_checkpointing: the files are plain safetensors that
HF tooling reads, a TP shard is one file (split/merge is a tensor concat, see convert.py; a run resumes
at another TP size by re-cutting them, infir/train/reshard.py), and the
atomic-commit protocol (write `iter_N.tmp/`, rename, then replace `latest`) is a few lines we can
test by killing a run mid-save.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

FORMAT = "infir-mcore-v1"
LATEST = "latest"


def iter_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def shard_name(tp_rank: int) -> str:
    return f"model_tp{tp_rank}.safetensors"


def shard_path(iter_dir: Path, tp_rank: int) -> Path:
    return Path(iter_dir) / shard_name(tp_rank)


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of a megatron model that a checkpoint keeps (megatron's `_extra_state` holds none), where
    they live: an asynchronous save copies them to host memory beside the next step, not before it goes on."""
    return {k: v.detach() for k, v in model.state_dict().items() if not k.endswith("_extra_state") and v is not None}


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """model_tensors on the host, contiguous."""
    return {k: v.cpu().contiguous() for k, v in model_tensors(model).items()}


def save_shard(iter_dir: Path, tp_rank: int, state: dict[str, torch.Tensor]) -> None:
    save_tensors(shard_path(iter_dir, tp_rank), state)


def save_tensors(path: Path, state: dict[str, torch.Tensor]) -> None:
    # safetensors refuses tensors that share storage (tied weights appear once in megatron anyway).
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path))


def load_shard(iter_dir: Path, tp_rank: int) -> dict[str, torch.Tensor]:
    path = shard_path(iter_dir, tp_rank)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the checkpoint {iter_dir} is incomplete; copy the file back")
    return load_safetensors(path)


def check_shards(iter_dir: Path, tp: int) -> None:
    """Every one of the `tp` model shards of `iter_dir` is there and readable (headers only): a
    FileNotFoundError or ValueError naming the first that is not, and the fix."""
    for rank in range(tp):
        path = shard_path(iter_dir, rank)
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: the checkpoint {iter_dir}, written at tp={tp}, is "
                                    "incomplete; copy the file back")
        check_safetensors(path)


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a truncated or corrupt file is a ValueError that names it."""
    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise _unreadable(path, err) from None


def check_safetensors(path: Path) -> None:
    """Read only the header: a truncated or corrupt file is a ValueError that names it (safetensors
    checks that the header's byte ranges cover the file exactly)."""
    try:
        with safe_open(str(path), "pt"):
            pass
    except SafetensorError as err:
        raise _unreadable(path, err) from None


def _unreadable(path: Path, err: Exception) -> ValueError:
    return ValueError(f"{path} is not a readable safetensors file ({err}): it is truncated or corrupt; "
                      "write or copy it again")


def read_json(path: Path) -> dict:
    """A JSON object from `path`; a truncated or corrupt file is a ValueError that names it."""
    try:
        value = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        reason = (f"{err.msg} at line {err.lineno} column {err.colno}" if isinstance(err, json.JSONDecodeError)
                  else "not UTF-8")
        raise ValueError(f"{path} is not valid JSON ({reason}): it is truncated or corrupt; "
                         "write or copy it again") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object: it is not the file expected there")
    return value


def write_meta(iter_dir: Path, meta: dict) -> None:
    meta = {"format": FORMAT, **meta}
    (Path(iter_dir) / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))


def read_meta(iter_dir: Path) -> dict:
    path = Path(iter_dir) / "meta.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {iter_dir} is not an infir checkpoint directory")
    meta = read_json(path)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} has format {meta.get('format')!r}; expected {FORMAT!r}")
    tp = meta.get("tp")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"{path} has tp={tp!r}; expected the tensor-parallel size it was written at, an integer >= 1")
    return meta


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp_dir: Path, final_dir: Path) -> None:
    """Make a fully written `tmp_dir` the newest checkpoint: rename it, then point `latest` at it.

    Both steps are atomic renames, so a crash at any instant leaves `latest` naming a complete
    directory (the old one or the new one), never a half-written one.
    """
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    for f in tmp_dir.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    fsync_dir(tmp_dir)
    if final_dir.exists():  # a re-save of the same iteration after a resume
        import shutil

        shutil.rmtree(final_dir)
    os.replace(tmp_dir, final_dir)
    root = final_dir.parent
    tmp_latest = root / f".{LATEST}.tmp"
    tmp_latest.write_text(final_dir.name + "\n")
    with open(tmp_latest, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp_latest, root / LATEST)
    fsync_dir(root)


def resolve(path: str | Path) -> Path:
    """An iteration directory from a checkpoints root (via `latest`), a run dir, or the iteration dir itself."""
    path = Path(path)
    if (path / "meta.json").exists():
        return path
    for root in (path, path / "checkpoints"):
        latest = root / LATEST
        if latest.exists():
            it = root / latest.read_text().strip()
            if not (it / "meta.json").exists():
                raise FileNotFoundError(f"{latest} names {it}, which has no meta.json: the checkpoint is damaged")
            return it
    raise FileNotFoundError(
        f"no infir checkpoint at {path}: expected meta.json there, or a '{LATEST}' file in it or in its checkpoints/ folder"
    )
