"""A checkpoint written at another tensor-parallel size, re-cut to this run's: model weights and optimizer states.

Weights: each tensor of the saved shards is merged as `infir-convert` merges them (convert.merge_tensor:
the fused QKV by query group, FC1's gate and up halves apart), then split to this run's size; this rank
keeps its piece. Tensor by tensor, so that a rank holds its own shard and one whole tensor at a time.

Optimizer states: for each saved tensor-parallel rank, every parameter's whole state is joined from the
data-parallel ranks that held its ranges (DataParallelOptimizer.whole_states). Each state with one value
per element (exp_avg, exp_avg_sq, 8-bit codes, FlashAdamW's weight corrections, and its 32-element group
scales once spread over their elements: ranges.per_element) is shaped as the saved shard, merged and
split as the weight is, and gathered into groups again (ranges.regrouped: a group of the new cut that holds
elements of one saved group keeps its scale and codes exactly; one that gathers elements of two saved
groups with different scales is quantized afresh). The new whole states are then cut into this rank's
data-parallel ranges (load_whole). Scalars (the step count) are equal on every tensor-parallel rank: rank 0's.

Parameters are known by their position in the optimizer's order, which is the same at every tensor-parallel
size (the model's parameters, matrices first); the checkpoint's `param_names` (meta.json) names them, so that
each state is cut by its parameter's layout. Checkpoints written before it was saved take this run's names.
"""
from __future__ import annotations

import math
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from infir.model import ckpt_format as fmt
from infir.model.convert import merge_tensor, split_tensor, tp_layout
from infir.optim.ranges import per_element, regrouped


def shard_shape(name: str, shape: tuple, tp_from: int, tp_to: int) -> tuple:
    """The shape at tensor-parallel size `tp_to` of the shard of parameter `name` shaped `shape` at `tp_from`."""
    dim = {"column": 0, "gated": 0, "row": 1}.get(tp_layout(name))
    if dim is None:
        return tuple(shape)
    out = list(shape)
    out[dim] = out[dim] * tp_from // tp_to
    return tuple(out)


def weights(iter_dir: Path, tp_saved: int, info) -> dict[str, torch.Tensor]:
    """This rank's model shard at this run's tensor-parallel size, from the `tp_saved` shards of `iter_dir`."""
    fmt.check_shards(iter_dir, tp_saved)
    paths = [fmt.shard_path(iter_dir, rank) for rank in range(tp_saved)]
    with ExitStack() as stack:
        files = [stack.enter_context(safe_open(str(path), "pt")) for path in paths]
        keys = list(files[0].keys())
        for path, f in zip(paths[1:], files[1:]):
            if set(f.keys()) != set(keys):
                raise ValueError(f"{path} holds other tensors than {paths[0]}: the shards are not of one checkpoint")
        return {key: split_tensor(key, merge_tensor(key, [f.get_tensor(key) for f in files]), info.tp)[info.tp_rank]
                for key in keys}


def optimizer_states(optimizer, saved: list[list[dict]], names: list[str] | None, info) -> None:
    """Load into `optimizer` (a DataParallelOptimizer) this rank's states from `saved`: for each tensor-parallel
    rank of the run that wrote them, the state_dict()s of its data-parallel ranks. `names`: the saved
    `param_names` (None: an older checkpoint, whose parameters are this run's, in this run's order)."""
    kind = optimizer.state_kind
    if kind is None:  # this rank's shares are all padding
        return
    names = names or optimizer.param_names
    if names != optimizer.param_names:
        raise ValueError("the checkpoint's parameters are not this model's (param_names in meta.json differ)")
    grouped = getattr(kind, "GROUPED_STATES", {})
    shapes = [shard_shape(n, s, info.tp, len(saved)) for n, s in zip(names, optimizer.param_shapes)]
    numel = [math.prod(s) for s in shapes]
    per_rank = [optimizer.whole_states(states, numel) for states in saved]
    if any(set(states) != set(per_rank[0]) for states in per_rank[1:]):
        raise ValueError("the tensor-parallel ranks' files hold states of different parameters")
    whole = {}
    for index in per_rank[0]:
        states = [per_element(states[index], numel[index], grouped) for states in per_rank]
        whole[index] = _recut(names[index], states, shapes[index], info, grouped, getattr(kind, "requantized", None))
    optimizer.load_whole(whole)


def _recut(name: str, states: list[dict], saved_shape: tuple, info, grouped: dict[str, int], requantize) -> dict:
    """One parameter's whole state at this run's tensor-parallel rank from its per-element states on every saved rank."""
    out = {}
    for key, value in states[0].items():
        if torch.is_tensor(value) and value.dim() > 0:
            full = merge_tensor(name, [state[key].view(saved_shape) for state in states])
            value = split_tensor(name, full, info.tp)[info.tp_rank].reshape(-1)
        out[key] = value
    return regrouped(out, grouped, requantize)
