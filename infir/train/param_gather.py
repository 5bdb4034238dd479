"""ZeRO-1 parameter gathers narrower than the parameters: each rank sends its share of a gradient bucket in a
narrower dtype, and the parameters that must arrive exactly go in a second gather in their own dtype, both in
one NCCL group (two collectives on the communication stream would wait for each other there, and with
CUDA_DEVICE_MAX_CONNECTIONS=1 hold up the compute queued behind them).

BucketBf16Gather: FP32 parameters of a BF16-autocast model. Every GEMM reads its weight rounded to BF16
(autocast; the embedding's output is cast to BF16, the LM-head loss rounds its weight), so a rank needs only
the BF16 rounding of the other ranks' elements, which is what megatron's DistributedOptimizer gathers (BF16
model parameters, FP32 masters in the optimizer's shard): half the bytes of the FP32 parameters, and the same
BF16 operands, bit for bit, on every rank. The RMSNorm weights, read in FP32, arrive exactly. What a rank
holds of the others' elements is then their BF16 value, not the master: `sync_params` gathers them in full
where the parameters themselves are read (checkpoints).

The FP8 parameter gather (fp8_param_gather.py) sends the FP8 linears' weights as FP8 bytes the same way.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager


class ExactParams:
    """The elements of a bucket's `params` ([start, end) spans in the bucket) gathered in their own dtype beside a
    narrower gather: each rank packs its elements of them, and unpacks the others' into place."""

    def __init__(self, data: torch.Tensor, spans: list[tuple[int, int]], rank: int, ranks: int):
        share = data.numel() // ranks
        # every rank's elements of them: (start, end) in the bucket, per rank
        segments = [[(max(a, r * share), min(b, (r + 1) * share)) for a, b in sorted(spans)
                     if min(b, (r + 1) * share) > max(a, r * share)] for r in range(ranks)]
        self.length = max(sum(b - a for a, b in segs) for segs in segments)
        self.packed = data.new_empty(self.length)
        self.gathered = data.new_empty(self.length * ranks)
        # views made once, copied in one call a step (a copy per segment from Python kept the host behind the GPU)
        self.own = [data[a:b] for a, b in segments[rank]]
        self.places, self.sources = [], []
        for r, segs in enumerate(segments):
            pos = r * self.length
            for a, b in segs if r != rank else ():
                self.places.append(data[a:b])
                self.sources.append(self.gathered[pos:pos + b - a])
                pos += b - a

    @property
    def wire_bytes(self) -> int:
        return self.length * self.packed.element_size()

    def pack(self) -> None:
        """This rank's elements, packed to be sent."""
        if self.own:
            torch.cat(self.own, out=self.packed[:sum(t.numel() for t in self.own)])

    def gather(self, group) -> None:
        """Every rank's packed elements (called inside the caller's NCCL group)."""
        if self.length:
            dist.all_gather_into_tensor(self.gathered, self.packed, group=group)

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
        self.exact = ExactParams(data, spans, self.rank, ranks)
        self.mine = data[self.rank * self.share:(self.rank + 1) * self.share]
        self.others = [r for r in range(ranks) if r != self.rank]
        self.theirs = [data[r * self.share:(r + 1) * self.share] for r in self.others]
        # the BF16 copy of the bucket exists only while its gather is in flight (one or two buckets at a time):
        # kept, it would add 2 bytes to every parameter's 4
        self.wire: torch.Tensor | None = None

    @property
    def wire_bytes(self) -> int:
        """Bytes this rank sends per step: its share in BF16 and its exact parameters' elements."""
        return self.share * 2 + self.exact.wire_bytes

    def start(self) -> list:
        """This rank's share rounded to BF16, and the gathers of it and of the exact parameters started."""
        self.wire = torch.empty(self.share * (len(self.others) + 1), dtype=torch.bfloat16, device=self.mine.device)
        mine = self.wire[self.rank * self.share:(self.rank + 1) * self.share]
        mine.copy_(self.mine)
        self.exact.pack()
        with _coalescing_manager(group=self.group, async_ops=True) as gathers:
            self.exact.gather(self.group)
            dist.all_gather_into_tensor(self.wire, mine, group=self.group)
        return [gathers]

    def finish(self, works: list) -> None:
        """Wait for the gathers; the other ranks' shares into the parameters, then their exact elements over them."""
        for work in works:
            work.wait()
        if self.theirs:
            torch._foreach_copy_(self.theirs, [self.wire[r * self.share:(r + 1) * self.share] for r in self.others])
        self.wire = None
        self.exact.finish()

    def sync_params(self) -> None:
        gather_full(self.bucket.param_data, self.group)
