"""FP8 parameter all-gather under ZeRO-1 (`optimizer.fp8_param_gather`): after each rank steps its share
of a gradient bucket, the FP8 linears' weights in that share cross the wire as the FP8 bytes the next
forward reads, instead of as the BF16/FP32 parameters every rank would then quantize again.

megatron's `fp8_param_gather` does this for Transformer Engine's per-tensor scaling. Block scales need
one more exchange, because a share is a range of elements that cuts 128x128 blocks: each rank writes the
amax of its elements per block (infir.fp8 block_range_amax), one all-reduce MAX of those (4 bytes per
16384 elements) gives every rank the whole weight's block scales, and each rank quantizes its range under
them into a byte buffer laid out as the bucket. Its all-gather leaves every rank the FP8 weights, bit for
bit those of quantizing the gathered weights (tests/train/test_fp8_param_gather.py); each layer's
WeightCache adopts its slice of the buffer (no copy), so a bucket's gather is one collective in place. The
buckets' other parameters (norms, biases, an embedding sharing a bucket) cross in their own dtype, all buckets'
in one small gather beside the amax all-reduce, before the buckets' gathers start (a second collective per
bucket would queue behind the first, or, grouped with it, slow it down: param_gather.py).

What a rank does not own of an FP8 weight stays as the previous step left it in the parameter: nothing in
a step reads it (fprop and dgrad read the FP8 copy, wgrad only activations). `sync_params` gathers those
in full where the parameters themselves are read: checkpoints, FP8 health readings.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from infir.fp8 import Recipe, WeightCache
from infir.fp8.weight_cache import BlockLayoutRefresh
from infir.fp8.dispatch import block_range_amax, quantize_block_range
from infir.fp8.formats import get_format, scale_from_amax
from infir.fp8.quantize import WEIGHT_BLOCK
from infir.train.param_gather import ExactParams, gather_full


def gathers_in_fp8(recipe: Recipe) -> bool:
    """Whether the recipe's weights can cross as FP8: 128x128 blocks with scales from their amax (MOSS's
    predicted per-tensor scales and per-tensor JIT scaling keep the parameter gather)."""
    return recipe.fp8 and recipe.weight.granularity == "block" and not recipe.autoscale_weights


@dataclass
class _Weight:
    param: torch.nn.Parameter
    cache: WeightCache
    at: int  # the parameter's first element in the bucket
    lo: int  # this rank's range of the parameter's elements: [lo, hi), empty where lo == hi
    hi: int
    amax: torch.Tensor | None  # [ceil(N/128), ceil(K/128)] views into the amax and scale vectors (bind)
    scale: torch.Tensor | None
    data: torch.Tensor  # the FP8 [N, K] view into the bucket's byte buffer that the cache adopts


class BucketFp8Gather:
    """One bucket's parameter gather with its FP8 weights (`targets`: parameter -> its layer's WeightCache)
    moved as FP8; `recipe` is theirs."""

    def __init__(self, buffer, bucket, group, targets: dict, recipe: Recipe):
        self.bucket, self.group, self.recipe = bucket, group, recipe
        ranks, self.rank = group.size(), group.rank()
        data = bucket.param_data
        self.share = data.numel() // ranks
        self.bytes = torch.zeros(data.numel(), dtype=torch.uint8, device=data.device)
        spans = {p: (buffer.param_index_map[p][0] - bucket.offset, buffer.param_index_map[p][1] - bucket.offset)
                 for p in bucket.params}
        fp8 = [p for p in sorted(bucket.params, key=lambda q: spans[q][0]) if p in targets]
        self.weights = []
        mine = (self.rank * self.share, (self.rank + 1) * self.share)
        dtype = get_format(recipe.weight.fmt).dtype
        for p in fp8:
            at, end = spans[p]
            lo, hi = max(at, mine[0]) - at, min(end, mine[1]) - at
            self.weights.append(_Weight(p, targets[p], at, lo, max(lo, hi), None, None,
                                        self.bytes[at:end].view(dtype).view(p.shape)))
        self.blocks = sum(_blocks(p.shape) for p in fp8)  # block scales of its FP8 weights
        # the bucket's other parameters (norms, biases, an embedding sharing the bucket): gathered exactly, with
        # every bucket's at once (Fp8ParamGather)
        self.other_spans = [spans[p] for p in bucket.params if p not in targets]
        # bytes this rank sends per step: its share of the FP8 buffer and its elements of the other parameters
        self.wire_bytes = self.share + ExactParams([(data, self.other_spans)], self.rank, ranks).wire_bytes
        self.adopted: list = []  # its weights' FP8 QTensors, as last adopted

    def bind(self, amax: torch.Tensor, scales: torch.Tensor) -> None:
        """Its weights' block amaxes and scales as views of `amax` and `scales` ([self.blocks] each)."""
        edge = 0
        for w in self.weights:
            n, grid = _blocks(w.param.shape), (-(-w.param.shape[0] // WEIGHT_BLOCK), -1)
            w.amax, w.scale = amax[edge:edge + n].view(grid), scales[edge:edge + n].view(grid)
            edge += n

    def write_amax(self) -> None:
        """The block amaxes of this rank's elements of each FP8 weight (0 for blocks it has none of)."""
        for w in self.weights:
            if w.hi > w.lo:
                block_range_amax(w.param.detach().view(-1)[w.lo:w.hi], w.lo, tuple(w.param.shape), w.amax)

    def start(self) -> list:
        """Once the block scales are in: this rank's FP8 bytes under them, and the gather of the bucket's FP8
        bytes started (its work)."""
        fmt = self.recipe.weight
        for w in self.weights:
            if w.hi > w.lo:
                quantize_block_range(w.param.detach().view(-1)[w.lo:w.hi], w.lo, tuple(w.param.shape), w.scale,
                                     fmt.scale_format, fmt.fmt, out=w.data.view(-1)[w.lo:w.hi])
        lo = self.rank * self.share
        return [dist.all_gather_into_tensor(self.bytes, self.bytes[lo:lo + self.share], group=self.group, async_op=True)]

    def finish(self, works: list) -> None:
        """Wait for the gather."""
        for work in works:
            work.wait()

    def adopt(self) -> None:
        """Each layer's FP8 weight is its slice of the gathered bytes (after the parameters' versions moved),
        its scale layouts made where the cache took new tensors."""
        for w in self.weights:
            w.cache.adopt(w.param, self.recipe, w.data, w.scale)
        self.adopted = [w.cache.q for w in self.weights]

    def sync_params(self) -> None:
        """The parameters in full on every rank (the plain parameter gather), where they are read as such."""
        gather_full(self.bucket.param_data, self.group)


def _blocks(shape) -> int:
    return -(-shape[0] // WEIGHT_BLOCK) * -(-shape[1] // WEIGHT_BLOCK)


class Fp8ParamGather:
    """The FP8 gathers of every bucket that takes one: one all-reduce of every weight's block amaxes after
    the step and one gather of every bucket's other parameters, then each bucket's quantization and gather,
    as the forward comes to it. One exchange, not one per bucket: a collective between two buckets' steps
    would queue behind the gathers already started on the communication stream, and the next bucket's step
    would wait for them."""

    def __init__(self, buckets: list[BucketFp8Gather], group):
        self.buckets, self.group = {b.bucket: b for b in buckets}, group
        total = sum(b.blocks for b in buckets)
        device = buckets[0].bytes.device
        self.amax = torch.zeros(total, dtype=torch.float32, device=device)
        self.scales = torch.ones_like(self.amax)
        edge = 0
        for b in buckets:
            b.bind(self.amax[edge:edge + b.blocks], self.scales[edge:edge + b.blocks])
            edge += b.blocks
        self.recipe = buckets[0].recipe
        ranks, rank = group.size(), group.rank()
        self.exact = ExactParams([(b.bucket.param_data, b.other_spans) for b in buckets], rank, ranks)
        self.packed = torch.empty(self.exact.length, dtype=self.exact.dtype, device=device)
        self.gathered = torch.empty(self.exact.length * ranks, dtype=self.exact.dtype, device=device)
        self.exact.land(list(self.gathered.view(ranks, -1)) if self.exact.length else [])
        self.layouts: BlockLayoutRefresh | None = None  # of the weights as adopted (`_layouts_key`)
        self._layouts_key: list = []

    def exchange_scales(self) -> None:
        """After every bucket's share is stepped: the block scales of every weight, from their amaxes over
        the ranks' shares, and the buckets' other parameters (each bucket then starts its own gather,
        BucketFp8Gather.start)."""
        fmt = self.recipe.weight
        self.amax.zero_()
        for b in self.buckets.values():
            b.write_amax()
        dist.all_reduce(self.amax, op=dist.ReduceOp.MAX, group=self.group)
        if self.exact.length:  # the other parameters, in full on every rank before any forward reads them
            self.exact.pack(self.packed)
            dist.all_gather_into_tensor(self.gathered, self.packed, group=self.group)
            self.exact.finish()
        self.scales.copy_(scale_from_amax(self.amax, get_format(fmt.fmt), fmt.scale_format))
        # the layouts scaled_mm reads of the weights' scales, which WeightCache.adopt leaves to us, all at once;
        # before any forward of the step has saved them for its backward
        qs = [q for b in self.buckets.values() for q in b.adopted]
        if len(qs) != len(self._layouts_key) or any(a is not b for a, b in zip(qs, self._layouts_key)):
            self.layouts, self._layouts_key = (BlockLayoutRefresh(qs, self.scales) if qs else None), qs
        if self.layouts is not None:
            self.layouts()


def fp8_targets(model: torch.nn.Module) -> tuple[dict, Recipe | None]:
    """(weight -> its layer's WeightCache, their recipe) for the FP8 linears whose weights can cross as FP8."""
    from infir.model.fp8_linears import fp8_linears_of

    linears = [m for m in fp8_linears_of(model) if gathers_in_fp8(m.recipe)]
    recipes = {m.recipe for m in linears}
    if len(recipes) > 1:
        raise ValueError(f"the FP8 parameter gather takes one weight recipe, got {sorted(r.name for r in recipes)}")
    return {m.weight: m.weight_cache for m in linears}, next(iter(recipes), None)
