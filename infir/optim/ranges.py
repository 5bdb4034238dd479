"""A parameter's optimizer state cut into element ranges and put back together: how a sharded
optimizer's checkpoint (each data-parallel rank's share of every parameter) moves to another number
of shards, or to and from an unsharded one.

Every state tensor is per element of the parameter (flattened), per group of elements (FlashAdamW's
scales: an optimizer's ``GROUPED_STATES`` names them and their group size; shard boundaries fall on
group boundaries), or a scalar (the step count), which every range shares.
"""
from __future__ import annotations

import torch


def _kind(key: str, value, numel: int, grouped: dict[str, int]) -> str:
    if not torch.is_tensor(value) or value.dim() == 0:
        return "scalar"
    if key in grouped:
        return "grouped"
    if value.numel() != numel:
        raise ValueError(f"optimizer state {key!r} has {value.numel()} elements for a range of {numel}: "
                         "neither per element nor a declared group state")
    return "element"


def merge_ranges(pieces: list[tuple[int, int, dict]], whole_numel: int, grouped: dict[str, int]) -> dict:
    """The state of a whole parameter of `whole_numel` elements from `pieces`, (offset, numel, state)
    covering it exactly: element states flat, group states per group, scalars from the first piece."""
    pieces = sorted(pieces, key=lambda piece: piece[0])
    covered = 0
    for offset, numel, _ in pieces:
        if offset != covered:
            raise ValueError(f"optimizer state pieces leave elements {covered}..{offset} of a parameter uncovered")
        covered += numel
    if covered != whole_numel:
        raise ValueError(f"optimizer state pieces cover {covered} of a parameter's {whole_numel} elements")
    out = {}
    for key, value in pieces[0][2].items():
        kind = _kind(key, value, pieces[0][1], grouped)
        out[key] = value if kind == "scalar" else torch.cat([state[key].reshape(-1) for _, _, state in pieces])
    return out


def state_range(whole: dict, start: int, end: int, shape, grouped: dict[str, int]) -> dict:
    """The state of elements [start, end) of a parameter from its whole state (merge_ranges), element
    states shaped `shape`."""
    out = {}
    for key, value in whole.items():
        kind = _kind(key, value, value.numel() if torch.is_tensor(value) else 1, grouped)
        if kind == "scalar":
            out[key] = value.clone() if torch.is_tensor(value) else value
        elif kind == "grouped":
            g = grouped[key]
            if start % g:
                raise ValueError(f"a range starting at element {start} splits a group of {g} of state {key!r}")
            out[key] = value[start // g:-(-end // g)].clone()
        else:
            out[key] = value[start:end].clone().view(shape)
    return out
