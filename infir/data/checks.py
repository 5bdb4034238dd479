"""The data sources a config names (a prefix, a blend, a resolved mixture file) and whether they hold
what training reads, found from file headers and sizes (no data is read), so a missing or damaged
dataset fails before any process group, model or dataset is built, naming the file. megatron's own
reader would stop at the first problem with an AssertionError (and an AttributeError from its
``__del__``), or read past the end of a truncated file.

A megatron ``.idx`` file: 9 magic bytes, version (u64), dtype code (u8), sequence count n (u64),
document count d (u64), then n int32 lengths, n int64 byte offsets into ``.bin``, d int64
document starts, and n int8 modes in multimodal sets.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Sequence, Union

Blend = Union[str, Path, Sequence[str], Sequence[tuple[float, str]], tuple[list[str], list[float] | None]]

IDX_MAGIC = b"MMIDIDX\x00\x00"
_HEADER = struct.Struct("<9sQBQQ")
# megatron's DType codes -> bytes per token
_ITEMSIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}


def indexed_problem(prefix: str | Path) -> str | None:
    """What is wrong with the indexed dataset ``prefix.bin/.idx``, or None when it looks whole."""
    idx, bin_ = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    missing = [str(p) for p in (bin_, idx) if not p.is_file()]
    if missing:
        return f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing"
    with open(idx, "rb") as f:
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size or not header.startswith(IDX_MAGIC):
            return f"{idx} is not a megatron index (truncated or corrupt)"
        _, _, code, n, d = _HEADER.unpack(header)
        expected = _HEADER.size + 12 * n + 8 * d
        if code not in _ITEMSIZE or idx.stat().st_size not in (expected, expected + n):
            return f"{idx} is truncated or corrupt (its header promises {n:,} sequences)"
        if n == 0:
            return f"{prefix} holds no documents"
        f.seek(_HEADER.size + 4 * (n - 1))
        (last_length,) = struct.unpack("<i", f.read(4))
        f.seek(_HEADER.size + 4 * n + 8 * (n - 1))
        (last_pointer,) = struct.unpack("<q", f.read(8))
    size = last_pointer + last_length * _ITEMSIZE[code]
    if bin_.stat().st_size != size:
        return f"{bin_} holds {bin_.stat().st_size:,} bytes where its index expects {size:,} (truncated, or another run's)"
    return None


def is_mixture_file(blend) -> bool:
    return isinstance(blend, (str, Path)) and str(blend).endswith((".yaml", ".yml"))


def _is_weight(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def blend_parts(blend: Blend) -> tuple[list[str], list[float] | None]:
    """``([prefixes], [weights] or None)`` of any blend spelling; TypeError for anything else."""
    if isinstance(blend, (str, Path)):
        return [str(blend)], None
    if isinstance(blend, tuple) and len(blend) == 2 and isinstance(blend[0], list) \
            and (blend[1] is None or isinstance(blend[1], list)):
        return [str(p) for p in blend[0]], blend[1]
    if isinstance(blend, (list, tuple)) and blend and all(isinstance(b, (str, Path)) for b in blend):
        return [str(p) for p in blend], None
    if isinstance(blend, (list, tuple)) and blend and all(isinstance(b, (tuple, list)) and len(b) == 2 for b in blend):
        return [str(p) for _, p in blend], [float(w) for w, _ in blend]
    if isinstance(blend, (list, tuple)) and len(blend) % 2 == 0 and blend \
            and all(_is_weight(w) and isinstance(p, (str, Path)) for w, p in zip(blend[::2], blend[1::2])):
        return [str(p) for p in blend[1::2]], [float(w) for w in blend[::2]]  # the config's [w, prefix, ...]
    raise TypeError(f"cannot read blend {blend!r}: give a prefix, a list of prefixes, [weight, prefix, ...], "
                    "[(weight, prefix), ...] or ([prefixes], [weights])")


def pretrain_prefixes(source) -> list[str]:
    """The dataset prefixes a pretraining source reads: a prefix, a blend, or a resolved mixture file.
    ValueError (or MixtureError) when it is none of them."""
    if is_mixture_file(source):
        from infir.data.mixture import load_resolved

        if not Path(source).is_file():
            raise ValueError(f"{source} does not exist")
        return [p for phase in load_resolved(source) for p in phase.blend[0]]
    try:
        return blend_parts(source)[0]
    except TypeError as err:
        raise ValueError(str(err)) from None


def source_problem(source, sft: bool) -> str | None:
    """What is wrong with a stage's source (an SFT prefix, or any pretraining source), or None."""
    if sft:
        from infir.data.sft import mask_prefix

        if not isinstance(source, (str, Path)):
            return f"an SFT source is one prefix, got {source!r}"
        prefixes = [str(source), mask_prefix(source)]
    else:
        try:
            prefixes = pretrain_prefixes(source)
        except ValueError as err:
            return str(err)
    return next((p for p in map(indexed_problem, prefixes) if p is not None), None)
