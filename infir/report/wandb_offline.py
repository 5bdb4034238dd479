"""Read a W&B offline run (`wandb/offline-run-*/run-*.wandb`) without a network or a W&B account.

wandb >= 0.19 no longer ships a Python reader for its transaction log, so this module reads it directly.
The file is a LevelDB-style log: a 7-byte file header (b":W&B", magic 0xBEE1, version 0), then 32 KiB
blocks of chunks, each chunk `crc32c:u32 length:u16 type:u8` + payload; a record is one FULL chunk or a
FIRST, MIDDLE..., LAST sequence, and a block tail shorter than a chunk header is zero padding. Each
record is a `wandb.proto.wandb_internal_pb2.Record` protobuf; we keep `run` (name, config), `config`
updates and `history` rows, and whether the `exit` record (written when the run finishes) is there.
CRCs are not checked: reading stops at a torn record or at a chunk header not yet written (zeros; the
writer, wandb-core, is still flushing a run that has just finished), which is what a reader of a
half-written log wants. Call again once `finished` is True for the whole run.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

_FILE_HEADER = struct.Struct("<4sHB")
_FILE_IDENT, _FILE_MAGIC = b":W&B", 0xBEE1
_CHUNK_HEADER = struct.Struct("<IHB")
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """What the report needs from one W&B run: its name, config and history rows (dicts)."""

    path: Path
    name: str = ""
    job_type: str = ""
    finished: bool = False  # the exit record is in the file
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)


def iter_records(path: Path):
    """Yield the raw payload of every complete record in a .wandb log, in order."""
    data = Path(path).read_bytes()
    if len(data) < _FILE_HEADER.size:
        raise ValueError(f"{path}: too short to be a W&B run file ({len(data)} bytes)")
    ident, magic, _version = _FILE_HEADER.unpack_from(data, 0)
    if ident != _FILE_IDENT or magic != _FILE_MAGIC:
        raise ValueError(f"{path}: not a W&B transaction log (header {data[:7]!r}); pass the run-*.wandb file")
    pos, pending = _FILE_HEADER.size, b""
    while pos + _CHUNK_HEADER.size <= len(data):
        if _BLOCK - pos % _BLOCK < _CHUNK_HEADER.size:
            pos += _BLOCK - pos % _BLOCK  # zero padding up to the next block
            continue
        _crc, length, kind = _CHUNK_HEADER.unpack_from(data, pos)
        pos += _CHUNK_HEADER.size
        payload = data[pos:pos + length]
        pos += length
        if len(payload) < length or kind not in (_FULL, _FIRST, _MIDDLE, _LAST):
            return  # torn tail of a writer that died mid-record, or a header still being written
        if kind == _FULL:
            yield payload
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            yield pending + payload
            pending = b""


def _item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def _item_value(item):
    return json.loads(item.value_json) if item.value_json else None


def read_offline_run(run_dir: Path) -> OfflineRun:
    """Parse the single run-*.wandb file of an offline run directory."""
    from wandb.proto import wandb_internal_pb2 as pb  # heavy import, only when W&B dirs are given

    files = sorted(Path(run_dir).glob("run-*.wandb"))
    if len(files) != 1:
        raise FileNotFoundError(f"{run_dir}: expected exactly one run-*.wandb file, found {len(files)}")
    run = OfflineRun(path=Path(run_dir))
    for payload in iter_records(files[0]):
        record = pb.Record()
        try:
            record.ParseFromString(payload)
        except Exception:  # protobuf's DecodeError: a torn record at the end
            continue
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.name = record.run.display_name or run.name
            run.job_type = record.run.job_type or run.job_type
            run.config.update({_item_key(u): _item_value(u) for u in record.run.config.update})
        elif kind == "config":
            run.config.update({_item_key(u): _item_value(u) for u in record.config.update})
        elif kind == "exit":
            run.finished = True
        elif kind == "history":
            row = {_item_key(i): _item_value(i) for i in record.history.item}
            run.history.append({k: v for k, v in row.items() if not k.startswith("_") or k == "_step"})
    run.config.pop("_wandb", None)
    return run
