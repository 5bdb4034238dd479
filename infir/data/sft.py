"""SFT data: chat jsonl -> tokenized samples with loss masks on disk -> packed training sequences.

On disk (``infir-prep sft --output PREFIX``), two megatron indexed datasets with one sequence per
sample: ``PREFIX.bin/.idx`` (token ids) and ``PREFIX.lossmask.bin/.idx`` (uint8, 1 on assistant
tokens), plus ``PREFIX.stats.json``; all renamed into place at the end, and written only when at
least one sample is usable. Samples are stored unpacked; ``build_sft_dataset(PREFIX, S)``
packs them for context ``S`` when it loads (best-fit decreasing, deterministic, cheap), so one
prepared set serves any context length.

A sample of ``L`` tokens takes ``L - 1`` positions of a packed row (inputs ``t[:-1]``, labels
``t[1:]``), so a row's samples never predict across a boundary. Each row's ``position_ids``
restart at 0 per sample (and at the padding tail): the trainer reads the documents its attention
keeps apart from them (infir.model.documents: variable-length kernels, no [s, s] mask).
"""
from __future__ import annotations

import bisect
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from infir.data.chat import BadSample, ChatFormatter, to_messages
from infir.data.sources import iter_rows, plan_shards
from infir.data.tokenize_corpus import _atomic_write_json, megatron_indexed, no_documents, staged, token_dtype

OVERLONG_POLICIES = ("drop", "truncate")


def mask_prefix(prefix: str | Path) -> str:
    return f"{prefix}.lossmask"


def prepare_sft(
    inputs: Path | str | Sequence[Path | str],
    output_prefix: Path | str,
    tokenizer_dir: Path | str,
    seq_length: int,
    overlong: str = "drop",
    progress: bool = True,
) -> dict:
    """Tokenize chat rows (one jsonl/parquet file, or several read in order) into PREFIX (tokens) +
    PREFIX.lossmask; returns the stats."""
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {overlong!r}")
    if seq_length < 2:
        raise ValueError(f"seq_length must be >= 2, got {seq_length}")
    inputs = [Path(inputs)] if isinstance(inputs, (str, Path)) else [Path(p) for p in inputs]
    if not inputs:
        raise ValueError("no input files given")
    for path in inputs:
        if not path.exists():
            raise FileNotFoundError(f"input {path} does not exist")
    fmt = ChatFormatter(tokenizer_dir)
    output_prefix = str(output_prefix)
    Path(output_prefix).parent.mkdir(parents=True, exist_ok=True)
    outputs = [output_prefix + ".bin", output_prefix + ".idx", mask_prefix(output_prefix) + ".bin",
               mask_prefix(output_prefix) + ".idx"]
    with staged(*outputs) as partial:
        counts, skipped, skipped_lines = _write_samples(inputs, partial, fmt, seq_length, overlong, progress)
        if not counts["samples"]:
            raise no_documents(inputs, "sample", dict(skipped), [_example(e) for e in skipped_lines[:1]],
                               _fix_for(skipped))
    stats = {
        "output": output_prefix, "seq_length": seq_length, "overlong": overlong,
        "samples": counts["samples"], "tokens": counts["tokens"], "loss_tokens": counts["loss_tokens"],
        "truncated": counts["truncated"], "skipped": dict(skipped),
        "skipped_examples": [_example(e) for e in skipped_lines[:50]],
        "chat_template": "fallback ChatML" if fmt.uses_fallback_template else "tokenizer's own",
        "tokenizer": fmt.tok.fingerprint,
        "pad_id": fmt.tok.eod,  # fills the tail of packed rows (masked out of the loss)
    }
    with open(output_prefix + ".skipped.jsonl", "w") as f:
        for e in skipped_lines:
            f.write(json.dumps(e) + "\n")
    _atomic_write_json(Path(output_prefix + ".stats.json"), stats)
    return stats


def _fix_for(skipped: Counter) -> str:
    if "longer than seq_length" in skipped:
        return "raise --seq-length or pass --overlong truncate"
    return "each line needs 'messages' or 'prompt'/'response' with an assistant reply"


def _example(entry: dict) -> str:
    return f"{entry['file']}:{entry['line']}: {entry['reason']}"


def _write_samples(inputs: list[Path], outputs: list[str], fmt: ChatFormatter, seq_length: int, overlong: str,
                   progress: bool) -> tuple[Counter, Counter, list[dict]]:
    """Write every usable row of the inputs as one sequence of tokens and one of loss mask, to
    ``outputs`` (tokens .bin, .idx, masks .bin, .idx).

    Returns the counts (samples, tokens, loss_tokens, truncated), the skipped rows by reason, and
    one entry (file, line, reason) per skipped row.
    """
    idx = megatron_indexed()
    dtype = token_dtype(fmt.tok.vocab_size)
    tokens_out = idx.IndexedDatasetBuilder(outputs[0], dtype=dtype)
    masks_out = idx.IndexedDatasetBuilder(outputs[2], dtype=np.uint8)

    counts = Counter()
    skipped: Counter = Counter()
    skipped_lines = []
    rows = ((shard.path, *r) for path in inputs for shard in plan_shards(path, target_bytes=1 << 62)
            for r in iter_rows(shard))
    name = inputs[0].name if len(inputs) == 1 else f"{len(inputs)} files"
    bar = tqdm(unit=" samples", disable=not progress, desc=f"sft {name}", file=sys.stderr)
    try:
        for path, line, row, reason in rows:
            bar.update()
            if reason is None:
                try:
                    ids, mask = _encode_sample(fmt, row, seq_length, overlong, counts)
                except BadSample as err:
                    reason = str(err)
            if reason is not None:
                skipped[reason.split(" (")[0]] += 1
                skipped_lines.append({"file": str(path), "line": line, "reason": reason})
                continue
            tokens_out.add_document(np.asarray(ids, dtype=dtype), [len(ids)])
            masks_out.add_document(np.asarray(mask, dtype=np.uint8), [len(mask)])
            counts["samples"] += 1
            counts["tokens"] += len(ids)
            counts["loss_tokens"] += sum(mask)
    finally:  # an unreadable input ends the bar's line before the error is printed
        bar.close()
    tokens_out.finalize(outputs[1])
    masks_out.finalize(outputs[3])
    return counts, skipped, skipped_lines


def _encode_sample(fmt: ChatFormatter, row: dict, seq_length: int, overlong: str,
                   counts: Counter) -> tuple[list[int], list[int]]:
    """A row's token ids and loss mask, at most ``seq_length + 1`` tokens; BadSample when unusable.

    A truncated row counts in ``counts["truncated"]`` even when it is then skipped for having no
    assistant token left.
    """
    # One token past the longest usable sample tells an overlong one, without encoding all of it.
    ids, mask = fmt.encode(to_messages(row), max_tokens=seq_length + 2)
    if len(ids) - 1 > seq_length:
        if overlong == "drop":
            raise BadSample(f"longer than seq_length (more than {seq_length + 1} tokens)")
        ids, mask = ids[:seq_length + 1], mask[:seq_length + 1]
        counts["truncated"] += 1
    if not any(mask[1:]):
        raise BadSample("no assistant token within seq_length")
    return ids, mask


def pack_best_fit(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Bins of sample indices with ``sum(lengths[bin]) <= capacity`` (best-fit decreasing).

    Deterministic: ties in length keep index order. Every length must be <= capacity.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (remaining capacity, bin id), sorted
    for i in order:
        n = int(lengths[i])
        if n > capacity:
            raise ValueError(f"sample {i} needs {n} positions, more than the capacity {capacity}")
        j = bisect.bisect_left(free, (n, -1))
        if j < len(free):
            rem, b = free.pop(j)
        else:
            rem, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        if rem - n > 0:
            bisect.insort(free, (rem - n, b))
    return bins


class PackedSFTDataset(torch.utils.data.Dataset):
    """Packed SFT rows: ``tokens, labels, position_ids`` (int64) and ``loss_mask`` (float32), each of
    length ``seq_length``. Positions restart at 0 with each sample: that is where the trainer reads
    the boundaries of its attention (infir.model.documents)."""

    def __init__(self, prefix: str | Path, seq_length: int, seed: int = 1234):
        prefix = str(prefix)
        for p in (prefix, mask_prefix(prefix)):
            if not (Path(p + ".bin").is_file() and Path(p + ".idx").is_file()):
                raise FileNotFoundError(f"no SFT dataset at {prefix} ({p}.bin/.idx missing): "
                                        "build it with `infir-prep sft --output PREFIX ...`")
        idx = megatron_indexed()
        self.tokens = idx.IndexedDataset(prefix)
        self.masks = idx.IndexedDataset(mask_prefix(prefix))
        if len(self.tokens) != len(self.masks):
            raise ValueError(f"{prefix}: {len(self.tokens)} token sequences but {len(self.masks)} loss masks")
        stats_path = Path(prefix + ".stats.json")
        self.pad_id = int(json.loads(stats_path.read_text()).get("pad_id", 0)) if stats_path.is_file() else 0
        self.seq_length = seq_length
        positions = self.tokens.sequence_lengths.astype(np.int64) - 1
        keep = np.nonzero(positions <= seq_length)[0]
        self.dropped_overlong = int(len(positions) - len(keep))
        bins = pack_best_fit(positions[keep], seq_length)
        # Rows come out of best-fit grouped by size; shuffle them so any prefix of the epoch is
        # representative (the loop may still shuffle again).
        random.Random(seed).shuffle(bins)
        self.rows = [[int(keep[i]) for i in b] for b in bins]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        S = self.seq_length
        tokens = np.full(S, self.pad_id, dtype=np.int64)
        labels = np.full(S, self.pad_id, dtype=np.int64)
        loss_mask = np.zeros(S, dtype=np.float32)
        position_ids = np.zeros(S, dtype=np.int64)
        at = 0
        for sample in self.rows[i]:
            t = self.tokens[sample].astype(np.int64)
            m = self.masks[sample]
            n = len(t) - 1
            tokens[at:at + n] = t[:-1]
            labels[at:at + n] = t[1:]
            loss_mask[at:at + n] = m[1:]
            position_ids[at:at + n] = np.arange(n)
            at += n
        # The padding tail is one more document: it attends only to itself and carries no loss.
        position_ids[at:] = np.arange(S - at)
        return {
            "tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels),
            "loss_mask": torch.from_numpy(loss_mask), "position_ids": torch.from_numpy(position_ids),
        }


def build_sft_dataset(prefix: str | Path, seq_length: int, seed: int = 1234) -> PackedSFTDataset:
    return PackedSFTDataset(prefix, seq_length, seed=seed)
