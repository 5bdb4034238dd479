"""The optimizer skeleton shared by FlashAdamW, SRAdamW and BF16AdamW: a plain
``torch.optim.Optimizer`` whose ``step`` is a loop of ``step_param(p, group)``.

Stepping one parameter at a time is what lets the same update run from ``step()``, from a
post-accumulate-grad hook inside backward (release.py), or between an H2D and a D2H copy of its
states (offload.py). Subclasses give the state layout (``_init_state``) and the update
(``_update``); this class owns the step count, gradient lookup, offloading and checkpoints.

A "parameter" may also be a shard: a contiguous run of a larger parameter's elements, as a
data-parallel rank of a sharded optimizer (ZeRO-1) holds it (``shard_view``). It is stepped as
that part of the whole parameter: its random stream and quantization groups are the whole
parameter's, so a sharded run takes the same steps as an unsharded one.
"""
import functools
from dataclasses import dataclass
from collections import defaultdict
from typing import Callable, Optional

import torch

from infir.optim.adam_math import AdamScalars
from infir.optim.packing import packed, packed_buffer

# every param of a group shares (hyper-parameters, step): compute the fp32 scalars once
_scalars = functools.lru_cache(maxsize=256)(AdamScalars.of)


@dataclass(frozen=True)
class Shard:
    """Where a shard view sits: the whole parameter's index (its position among the optimizer's
    params in an unsharded run), the shard's first element in it (flat), and the whole's size."""
    index: int
    offset: int
    whole_numel: int


def shard_view(param: torch.Tensor, start: int, end: int, index: int) -> torch.Tensor:
    """Elements [start, end) of ``param`` (flat) as a 1-D tensor sharing its storage, to be
    stepped as that part of parameter number ``index``: writes to it update ``param``."""
    view = param.detach().view(-1)[start:end]
    view.shard = Shard(index, start, param.numel())
    return view


def shard_of(p: torch.Tensor) -> Shard:
    """The Shard of a ``shard_view``; a whole parameter is the one shard of itself (index None:
    its position among the optimizer's params)."""
    return getattr(p, "shard", None) or Shard(None, 0, p.numel())


class PerParamOptimizer(torch.optim.Optimizer):
    GROUPED_STATES: dict[str, int] = {}  # state tensors kept per group of elements (ranges.py), and the group size

    @staticmethod
    def requantized(elements: dict[str, torch.Tensor], key: str) -> dict[str, torch.Tensor]:
        """Group state ``key`` (of GROUPED_STATES) and the codes it scales, quantized afresh from a
        parameter's flat state with ``key`` given per element (ranges.regrouped)."""
        raise NotImplementedError(f"{key!r} is declared a group state but cannot be quantized afresh")

    def __init__(self, params, defaults: dict, *, offload: bool = False, seed: int = 0):
        lr, (beta1, beta2) = defaults["lr"], defaults["betas"]
        if lr < 0 or not 0.0 <= beta1 < 1.0 or not 0.0 <= beta2 < 1.0 or defaults["eps"] < 0:
            raise ValueError(f"invalid AdamW hyper-parameters lr={lr} betas={defaults['betas']} "
                             f"eps={defaults['eps']}: need lr >= 0, 0 <= beta < 1, eps >= 0")
        super().__init__(params, defaults)
        self.seed = seed
        self._stepped_in_backward: set = set()
        self._offloader = None
        if offload:
            from infir.optim.offload import StateOffloader
            self._offloader = StateOffloader()

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        # a parameter's position is the same on every data-parallel rank: it keys the random
        # stream of stochastic rounding so that replicas stay bit-identical
        index = self.__dict__.setdefault("_index", {})
        for p in self.param_groups[-1]["params"]:
            given = shard_of(p).index
            index.setdefault(p, len(index) if given is None else given)

    # --- what a subclass provides ------------------------------------------------------------
    def _init_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor],
                group: dict, s: AdamScalars, seed: int) -> None:
        """Update ``p`` and the state tensors in place."""
        raise NotImplementedError

    # --- stepping ----------------------------------------------------------------------------
    @property
    def offload(self) -> bool:
        return self._offloader is not None

    @staticmethod
    def grad_of(p: torch.Tensor) -> Optional[torch.Tensor]:
        """``p.grad``, or megatron DDP's ``p.main_grad`` where backward wrote there instead."""
        return p.grad if p.grad is not None else getattr(p, "main_grad", None)

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p not in self._stepped_in_backward:
                    self.step_param(p, group)
        self._stepped_in_backward.clear()
        if self._offloader is not None:
            self._offloader.finish()
        return loss

    def _begin(self, p: torch.Tensor, group: dict):
        """Bookkeeping of one param's step: (grad, state tensors, scalars, seed), or None when
        the param has no gradient. Counts the step."""
        grad = self.grad_of(p)
        if grad is None:
            return None
        if grad.shape != p.shape:
            raise ValueError(f"gradient of shape {tuple(grad.shape)} for a param of shape "
                             f"{tuple(p.shape)}")
        state = self.state[p]
        if not state:
            state.update(self._packed(self._init_state(p), p))
            state["step"] = 0
        state["step"] += 1
        beta1, beta2 = group["betas"]
        s = _scalars(group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                     state["step"])
        seed = hash((self.seed, state["step"], self._index[p])) & 0x7FFF_FFFF
        tensors = {k: v for k, v in state.items() if k != "step"}
        return grad, tensors, s, seed

    @torch.no_grad()
    def step_param(self, p: torch.Tensor, group: dict) -> None:
        begun = self._begin(p, group)
        if begun is None:
            return
        grad, tensors, s, seed = begun
        if self._offloader is None:
            self._update(p, grad, tensors, group, s, seed)
        else:
            self._offloader.run(p, grad, tensors,
                                lambda dev: self._update(p, grad, dev, group, s, seed))

    def _packed(self, tensors: dict[str, torch.Tensor], p: torch.Tensor) -> dict[str, torch.Tensor]:
        """Copies of p's state tensors in one buffer: in pinned host memory when offloaded, else
        on p's device."""
        if self._offloader is not None:
            return self._offloader.to_host_packed(tensors)
        return packed(tensors, p.device)

    def synchronize(self) -> None:
        """Wait for every pending host write-back of offloaded states."""
        if self._offloader is not None:
            self._offloader.synchronize()

    # --- checkpoints -------------------------------------------------------------------------
    def state_dict(self):
        """torch's, except that a parameter's packed states (packing.py) are given as their one
        uint8 buffer plus a layout: torch.save refuses views of one storage under several dtypes,
        and the buffer saves without a copy. load_state_dict reads both forms."""
        self.synchronize()
        sd = super().state_dict()
        for i, st in sd["state"].items():
            tensors = {k: v for k, v in st.items() if torch.is_tensor(v)}
            buf = packed_buffer(tensors)
            if buf is None:
                continue
            base = buf.data_ptr()
            sd["state"][i] = {**{k: v for k, v in st.items() if not torch.is_tensor(v)}, "packed": buf,
                              "layout": {k: (v.dtype, tuple(v.shape), v.data_ptr() - base) for k, v in tensors.items()}}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Exact reload. torch's own loader casts floating states to the param dtype (fp16 scales
        would become bf16); this one keeps every tensor's dtype and bits."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(saved_groups, self.param_groups)):
            raise ValueError("optimizer state_dict has a different parameter-group layout than "
                             "this optimizer; build the optimizer over the same params in the "
                             "same order as the run that saved it")
        by_id = {i: p for sg, g in zip(saved_groups, self.param_groups)
                 for i, p in zip(sg["params"], g["params"])}
        self.synchronize()
        self.state = defaultdict(dict)
        for i, saved in state_dict["state"].items():
            p = by_id[i]
            saved = unpacked_state(saved)
            self.state[p] = {k: v for k, v in saved.items() if not torch.is_tensor(v)}
            self.state[p].update(self._packed({k: v for k, v in saved.items() if torch.is_tensor(v)}, p))
        for sg, g in zip(saved_groups, self.param_groups):
            g.update({k: v for k, v in sg.items() if k != "params"})


def unpacked_state(entry: dict) -> dict:
    """A param's entry of a state_dict with its tensors by name (a packed buffer taken apart)."""
    if "packed" not in entry:
        return dict(entry)
    return {**{k: v for k, v in entry.items() if k not in ("packed", "layout")}, **_unpacked(entry["packed"], entry["layout"])}


def _unpacked(buf: torch.Tensor, layout: dict) -> dict[str, torch.Tensor]:
    """The named state views of a saved packed buffer (PerParamOptimizer.state_dict)."""
    out = {}
    for k, (dtype, shape, offset) in layout.items():
        n = torch.Size(shape).numel() * dtype.itemsize
        out[k] = buf[offset:offset + n].view(dtype).view(shape)
    return out
