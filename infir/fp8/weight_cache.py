"""The FP8 copy of one weight, made once per optimizer step and read by every micro-batch."""
from __future__ import annotations

import torch

from .autoscale import AutoScaler
from .formats import amax_with_nan_as_inf
from .gemm import block_layout_copies, scaled_mm_scale
from .dispatch import quantize_weight
from .quantize import QTensor
from .recipe import Recipe


def _fields(fmt) -> tuple[str, str, str]:
    return fmt.granularity, fmt.scale_format, fmt.fmt


def tensors_of(q: QTensor) -> list:
    """Every tensor a QTensor holds (None where a field is unset), in a fixed order."""
    return [q.data, q.scale, q.global_scale, q.local_exp, *q.layout_cache.values()]


class WeightCache:
    """The FP8 copy of one weight, made once per optimizer step.

    dgrad reads the same FP8 values transposed (a 128x128 block of W is one of W^T), made in backward
    and freed after its GEMM, so no second FP8 copy of the weight is kept.

    Stale copies are detected by the weight's storage and in-place version counter, so a trainer
    that forgets to call step() still gets fresh weights; step(lr) after optimizer.step() is what
    advances MOSS automatic scaling (the predicted bound grows by the learning rate).
    """

    def __init__(self, name: str = ""):
        self.name = name
        self.autoscaler: AutoScaler | None = None
        self._key = None
        self.q: QTensor | None = None

    def invalidate(self) -> None:
        self._key = None

    def release(self) -> None:
        """Drop the FP8 copy (its memory goes once nothing else, such as autograd, holds it)."""
        self.q, self._key = None, None

    def step(self, lr: float) -> None:
        if self.autoscaler is not None:
            self.autoscaler.step(lr)
        self.invalidate()

    @staticmethod
    def key(weight: torch.Tensor, recipe: Recipe) -> tuple:
        return (weight.data_ptr(), weight._version, weight.dtype, recipe)

    def fresh(self, weight: torch.Tensor, recipe: Recipe) -> bool:
        """Whether the cached copy is of this weight as it is now."""
        return self._key == self.key(weight, recipe)

    def get(self, weight: torch.Tensor, recipe: Recipe) -> QTensor:
        if not self.fresh(weight, recipe):
            self.q = _refill(self.q, self._quantized(weight, recipe))
            self._key = self.key(weight, recipe)
        return self.q

    def refill(self, weight: torch.Tensor, recipe: Recipe) -> None:
        """Quantize `weight` into the tensors the cache already holds, allocating none that outlives
        the call: the step a CUDA graph of every layer's refresh records. The cache is marked fresh
        by mark_fresh once the graph has run."""
        if self.q is None or _refill(self.q, self._quantized(weight, recipe)) is not self.q:
            raise RuntimeError("WeightCache.refill needs a cached copy of the same shapes and formats "
                               "(fill it with get() first)")

    def mark_fresh(self, weight: torch.Tensor, recipe: Recipe) -> None:
        self._key = self.key(weight, recipe)

    def adopt(self, weight: torch.Tensor, recipe: Recipe, data: torch.Tensor, scale: torch.Tensor) -> None:
        """Take `data` (FP8 [N, K]) and `scale` (its 128x128 block scales), quantized elsewhere (the FP8
        parameter all-gather of a sharded optimizer), as the copy of `weight` as it is now. The tensors are
        kept, not copied, and scaled_mm's layouts of the scale are made on the first adopt of them. A later
        adopt of the same tensors takes those layouts as current: whoever writes new values into `scale`
        brings them up to date (gemm.block_layout_copies), for every weight at once rather than one weight
        at a time on the host here."""
        if recipe.weight.granularity != "block" or recipe.autoscale_weights:
            raise ValueError(f"WeightCache.adopt takes 128x128 block weights, not those of recipe {recipe.name!r}")
        old = self.q
        if old is None or old.data is not data or old.scale is not scale:
            q = QTensor(data, scale, "block", recipe.weight.scale_format, recipe.weight.fmt)
            scaled_mm_scale(q)
            scaled_mm_scale(q, transposed=True)
            self.q = q
        self.mark_fresh(weight, recipe)

    def _quantized(self, weight: torch.Tensor, recipe: Recipe) -> QTensor:
        w = weight.detach()
        if recipe.autoscale_weights:
            q = self._autoscaled(w, recipe)
        else:
            q = quantize_weight(w, *_fields(recipe.weight))
        if q.granularity == "block":
            # fprop's and dgrad's scale layouts, made here (eager, once a step) so that a
            # compiled layer gets them as inputs instead of rebuilding them every micro-batch
            # (on any device: the compiled graph then has one structure wherever it is traced)
            scaled_mm_scale(q)
            scaled_mm_scale(q, transposed=True)
        return q

    def _autoscaled(self, w: torch.Tensor, recipe: Recipe) -> QTensor:
        """MOSS: the per-tensor scale predicted from the update bound; the true amax is observed."""
        if self.autoscaler is None:
            self.autoscaler = AutoScaler(recipe.weight.fmt, recipe.resync_interval, self.name)
        scale = self.autoscaler.scale(w)
        seen = torch.zeros((), dtype=torch.float32, device=w.device) if w.is_cuda else None
        q = quantize_weight(w, *_fields(recipe.weight), scale=scale, record_amax=seen)
        self.autoscaler.observe(seen if w.is_cuda else amax_with_nan_as_inf(w))
        return q


def _refill(old: QTensor | None, new: QTensor) -> QTensor:
    """`new`'s values in `old`'s tensors where every one matches in shape, dtype and strides: the
    FP8 weight keeps its addresses from step to step, so CUDA graphs replaying a layer read the
    fresh weight instead of re-recording (or copying it in) on every step."""
    if old is None or old.granularity != new.granularity or old.layout_cache.keys() != new.layout_cache.keys():
        return new
    pairs = list(zip(tensors_of(old), tensors_of(new)))
    if any((a is None) != (b is None) or (a is not None and (a.shape, a.dtype, a.stride()) != (b.shape, b.dtype, b.stride()))
           for a, b in pairs):
        return new
    with torch.no_grad():
        for a, b in pairs:
            if a is not None:
                a.copy_(b)
    return old


def _ids(base: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """The flat indices into `base` (1-D, its own storage) of the elements of `view` (a view of it), in view order."""
    ids = torch.arange(base.numel(), device=base.device)
    return ids.as_strided(view.size(), view.stride(), view.storage_offset() - base.storage_offset()).reshape(-1)


class BlockLayoutRefresh:
    """scaled_mm's layouts of adopted block weights' scales (WeightCache.adopt), brought up to date after the
    scales change in place, all weights in one gather and one scatter. The scales must be views of one 1-D
    tensor `scales`; the layouts that are copies (transposed or column-padded: gemm.block_layout_copies) are
    moved here into one buffer. Why: as a copy per layout, each a strided one that torch's foreach copy runs
    as its own kernel, the host took longer to issue them than the GPU to run them, between the optimizer step
    and the first forward."""

    def __init__(self, qs: list, scales: torch.Tensor):
        self.scales = scales
        owned = [(q, key, t) for q in qs for key, t in q.layout_cache.items()
                 if t.untyped_storage().data_ptr() != q.scale.untyped_storage().data_ptr()]
        sizes = [t.untyped_storage().nbytes() // t.element_size() for _, _, t in owned]
        self.buffer = scales.new_empty(sum(sizes))
        at = 0
        for (q, key, t), n in zip(owned, sizes):
            home = self.buffer.as_strided(t.size(), t.stride(), at + t.storage_offset())
            home.copy_(t)  # the padding's ones too: each layout covers its storage
            q.layout_cache[key] = home
            at += n
        pairs = [pair for q in qs for pair in block_layout_copies(q)]
        self.dst = torch.cat([_ids(self.buffer, d) for d, _ in pairs]) if pairs else None
        self.src = torch.cat([_ids(scales, s) for _, s in pairs]) if pairs else None

    def __call__(self) -> None:
        if self.dst is not None:
            self.buffer.index_copy_(0, self.dst, self.scales.index_select(0, self.src))
