"""ZeRO-1 parameter gathers narrower than the parameters: each rank sends its share of a gradient bucket in a
narrower dtype, and the parameters that must arrive exactly cross in their own dtype beside it, in the same
collective: a bucket's gather is one NCCL collective. Two of them, on the communication stream, would wait there
for each other, and with CUDA_DEVICE_MAX_CONNECTIONS=1 hold up the compute queued behind them; the two as one
NCCL group (torch's coalescing manager) ran the bucket's large gather several times slower than alone.

BucketBf16Gather: FP32 parameters of a BF16-autocast model. Every GEMM reads its weight rounded to BF16
(autocast; the embedding's output is cast to BF16, the LM-head loss rounds its weight), so a rank needs only
the BF16 rounding of the other ranks' elements, which is what megatron's DistributedOptimizer gathers (BF16
model parameters, FP32 masters in the optimizer's shard): half the bytes of the FP32 parameters, and the same
BF16 operands, bit for bit, on every rank. The weights read in FP32 arrive exactly: the RMSNorm weights, and
under an FP8 recipe the FP8 linears' weights, which each rank quantizes itself. Their bits ride behind the
rank's BF16 share, as pairs of BF16 words; a bucket mostly of them keeps its plain gather (fewer bytes). What
a rank holds of the others' elements is then their BF16 value, not the master: `sync_params` gathers them in
full where the parameters themselves are read (checkpoints).

The FP8 parameter gather (fp8_param_gather.py) sends the FP8 linears' weights as FP8 bytes, and the exact
parameters of all its buckets in one small gather before them; beside it the buckets without FP8 weights (the
embedding's, the LM head's) take the BF16 gather, which under an FP8 recipe also sends any FP8 weight exactly.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class ExactParams:
    """The elements of some buckets' parameters that must cross exactly, in their own dtype: `pieces` are (a
    bucket's data, [start, end) spans of those parameters in it). Each rank packs its elements of them, in
    order, into `length` elements; the other ranks' packed elements are unpacked into place from where they
    landed (`land`, then `finish`)."""

    def __init__(self, pieces: list[tuple[torch.Tensor, list[tuple[int, int]]]], rank: int, ranks: int):
        segments: list[list[torch.Tensor]] = [[] for _ in range(ranks)]
        for data, spans in pieces:
            share = data.numel() // ranks
            for r in range(ranks):
                segments[r] += [data[max(a, r * share):min(b, (r + 1) * share)] for a, b in sorted(spans)
                                if min(b, (r + 1) * share) > max(a, r * share)]
        dtypes = {data.dtype for data, spans in pieces if spans}
        if len(dtypes) > 1:
            raise ValueError(f"ExactParams packs one dtype, got {sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop() if dtypes else torch.float32
        self.length = max((sum(t.numel() for t in segs) for segs in segments), default=0)
        # views made once, copied in one call a step (a copy per segment from Python kept the host behind the GPU)
        self.own = segments[rank]
        self._theirs = [(r, segs) for r, segs in enumerate(segments) if r != rank and segs]
        self.places: list[torch.Tensor] = []
        self.sources: list[torch.Tensor] = []

    @property
    def wire_bytes(self) -> int:
        return self.length * self.dtype.itemsize

    def pack(self, out: torch.Tensor) -> None:
        """This rank's elements into `out` (`length` elements of their dtype), to be sent."""
        if self.own:
            torch.cat(self.own, out=out[:sum(t.numel() for t in self.own)])

    def land(self, regions: list[torch.Tensor]) -> None:
        """Where each rank's packed elements arrive: regions[r], `length` elements of their dtype."""
        self.places, self.sources = [], []
        for r, segs in self._theirs:
            pos = 0
            for t in segs:
                self.places.append(t)
                self.sources.append(regions[r][pos:pos + t.numel()])
                pos += t.numel()

    def finish(self) -> None:
        """The other ranks' elements into their places (after the gather)."""
        if self.places:
            torch._foreach_copy_(self.places, self.sources)


def gather_full(data: torch.Tensor, group, async_op: bool = False):
    """The bucket's parameters in full, in their own dtype, on every rank (the plain parameter gather); its work
    where `async_op`."""
    rank, share = group.rank(), data.numel() // group.size()
    return dist.all_gather_into_tensor(data, data[rank * share:(rank + 1) * share], group=group, async_op=async_op)


class BucketBf16Gather:
    """One bucket's FP32 parameter gather as BF16, its `exact` parameters (read in FP32) in FP32."""

    def __init__(self, buffer, bucket, group, exact: set):
        self.bucket, self.group = bucket, group
        ranks, self.rank = group.size(), group.rank()
        data = bucket.param_data
        self.share = data.numel() // ranks
        spans = [(buffer.param_index_map[p][0] - bucket.offset, buffer.param_index_map[p][1] - bucket.offset)
                 for p in bucket.params if p in exact]
        self.exact = ExactParams([(data, spans)], self.rank, ranks)
        self.mine = data[self.rank * self.share:(self.rank + 1) * self.share]
        self.others = [r for r in range(ranks) if r != self.rank]
        self.theirs = [data[r * self.share:(r + 1) * self.share] for r in self.others]
        # a rank's part of the wire: its share in BF16, then its exact elements' bits as BF16 words (from an even
        # offset, where a BF16 view can be read as FP32)
        self.head = self.share + self.share % 2
        self.part = self.head + self.exact.wire_bytes // 2
        self.ranks = ranks
        # the wire exists only while its gather is in flight (one or two buckets at a time): kept, it would add
        # 2 bytes to every parameter's 4
        self.wire: torch.Tensor | None = None

    @property
    def wire_bytes(self) -> int:
        """Bytes this rank sends per step: its share in BF16 and its exact parameters' elements."""
        return self.part * 2

    def start(self) -> list:
        """This rank's share rounded to BF16 and its exact elements on the wire, and the gather started."""
        self.wire = torch.empty(self.part * self.ranks, dtype=torch.bfloat16, device=self.mine.device)
        parts = self.wire.view(self.ranks, self.part)
        parts[self.rank, :self.share].copy_(self.mine)
        if self.exact.length:
            exact = parts[:, self.head:].view(self.exact.dtype)
            self.exact.pack(exact[self.rank])
            self.exact.land(list(exact))
        return [dist.all_gather_into_tensor(self.wire, parts[self.rank], group=self.group, async_op=True)]

    def finish(self, works: list) -> None:
        """Wait for the gather; the other ranks' shares into the parameters, then their exact elements over them."""
        for work in works:
            work.wait()
        if self.theirs:
            parts = self.wire.view(self.ranks, self.part)
            torch._foreach_copy_(self.theirs, [parts[r, :self.share] for r in self.others])
        self.exact.finish()
        self.wire = None

    def sync_params(self) -> None:
        gather_full(self.bucket.param_data, self.group)
