"""`model=` accepts an HF model directory or a megatron checkpoint of ours (converted once, through
the same converter as `infir-convert`, into the run directory)."""
from __future__ import annotations

from pathlib import Path


def is_hf_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def is_megatron_checkpoint(path: Path) -> bool:
    """An infir checkpoint: an iteration dir, a checkpoints root with `latest`, or a training run dir."""
    from infir.model import ckpt_format

    try:
        ckpt_format.resolve(path)
    except (FileNotFoundError, ValueError):
        return False
    return True


def check_model(model: str | Path) -> Path:
    """`model` as a path, once it is an HF model directory (config.json and weights readable) or a
    megatron checkpoint (meta.json readable); the error names the file at fault otherwise."""
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model={model}: no such directory (give an HF model directory or a megatron checkpoint)")
    from infir.model import ckpt_format

    if is_hf_model_dir(path):
        ckpt_format.read_json(path / "config.json")
        for weights in sorted(path.glob("*.safetensors")):
            ckpt_format.check_safetensors(weights)
    elif is_megatron_checkpoint(path):
        ckpt_format.read_meta(ckpt_format.resolve(path))
    else:
        raise ValueError(f"model={model}: neither an HF model directory (config.json) nor a megatron checkpoint "
                         "(an infir run dir, its checkpoints/ folder, or an iter_* directory with meta.json)")
    return path


def resolve_model(model: str | Path, run_dir: Path) -> Path:
    """An HF model directory for `model`, converting a megatron checkpoint into run_dir/hf_model."""
    path = check_model(model)
    if is_hf_model_dir(path):
        return path
    target = Path(run_dir) / "hf_model"
    if not is_hf_model_dir(target):  # converted by an earlier, interrupted run of the same eval
        from infir.model.convert import mcore_to_hf  # lazily: megatron is not needed to evaluate HF models

        target = Path(mcore_to_hf(path, target))
    return target


def has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json"))
