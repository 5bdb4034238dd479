"""A parameter's optimizer state cut into element ranges and put back together: how a sharded
optimizer's checkpoint (each data-parallel rank's share of every parameter) moves to another number
of shards, or to and from an unsharded one.

Every state tensor is per element of the parameter (flattened), per group of elements (FlashAdamW's
scales: an optimizer's ``GROUPED_STATES`` names them and their group size; shard boundaries fall on
group boundaries), or a scalar (the step count), which every range shares.

A parameter cut otherwise (another tensor-parallel size: its rows split at another column) regroups its
elements: ``per_element`` spreads each group state over its elements, the caller rearranges them as the
parameter's, and ``regrouped`` gathers them into groups again.
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


def per_element(whole: dict, numel: int, grouped: dict[str, int]) -> dict:
    """A whole parameter's state (merge_ranges) with every group state repeated over its group's elements:
    each tensor state then holds one value per element, to be rearranged as the parameter's elements are."""
    out = {}
    for key, value in whole.items():
        grouped_state = _kind(key, value, numel, grouped) == "grouped"
        out[key] = value.repeat_interleave(grouped[key])[:numel] if grouped_state else value
    return out


def regrouped(elements: dict, grouped: dict[str, int], requantize) -> dict:
    """per_element's inverse, for elements that may have been rearranged. A group whose elements all carry
    one value of a group state keeps it, exactly (its codes are unchanged). A group gathering elements of
    saved groups with different values cannot keep them: `requantize(elements, key)` gives the codes and
    group values of state `key` quantized afresh from the elements' decoded values ({codes key: codes,
    key: per group}), taken in those groups only."""
    out = dict(elements)
    for key, size in grouped.items():
        if key not in elements:
            continue
        flat = elements[key]
        tail = flat[-1:].expand((-flat.numel()) % size)  # the last group's missing elements repeat its last one
        groups = torch.cat([flat, tail]).view(-1, size)
        first = groups[:, 0]
        kept = (groups == first[:, None]).all(dim=1)
        out[key] = first.clone()
        if kept.all():
            continue
        fresh = requantize(elements, key)
        mixed = (~kept).repeat_interleave(size)[:flat.numel()]
        for name, value in fresh.items():
            out[name] = torch.where(~kept, value, first) if name == key else torch.where(mixed, value, elements[name])
    return out
