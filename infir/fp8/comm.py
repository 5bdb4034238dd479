"""What moves between ranks around an FP8 linear's GEMMs: a strategy object the linear core calls.

The core (linear.Fp8LinearFunction) runs the same three GEMMs whatever the parallelism; around them a
strategy says what the input and its gradient go through:
- `LOCAL`: nothing moves (a single rank, a row-parallel layer, or a column-parallel layer whose input
  megatron already gathered).
- `SequenceParallel(group, world)`: the input is this rank's shard of the sequence. Its FP8 operand
  (bytes + scales) is all-gathered for fprop (half the bytes of gathering BF16), X^T's shards are kept
  local and gathered only in backward (half the saved memory at TP=2), and dgrad's dX is
  reduce-scattered back to the shards. Quantize-then-gather equals megatron's gather-then-quantize when
  no quantization group straddles two shards: per-token groups never do along K, and X^T's 128-token
  groups line up when each shard holds a multiple of 128 tokens (`takes` checks it).
  With `overlap`, the column-parallel GEMM is pipelined with the gather (`gather_consume`: this rank's
  rows multiply while the other ranks' arrive), and a row-parallel layer's reduce-scatter moves into
  the core (`ScatterOutput`), pipelined with its GEMM (`produce_scatter`).
- `ScatterOutput(group, world, rank)`: a row-parallel layer under sequence parallelism. Y's partial sums
  are reduce-scattered to the sequence shards inside the core: the other ranks' rows first, sent while
  this rank's rows multiply. In backward dY's shard is quantized and its FP8 operands are gathered (half
  the bytes of megatron's BF16 gather), dgrad pipelined with that gather.

Why not torch's async TP (torch.distributed._symmetric_memory): its fused ops take BF16 or row-wise
scaled operands, not 1x128 / 128x128 blocks with their scale layouts, and its pipelines need symmetric
memory, which neither gloo (the CPU tests) nor a CUDA graph recorded per layer can hold. The pipelines
here are functional collectives around the core's own GEMMs, so they run wherever the core runs.

Strategies are frozen dataclasses holding the group's *name*, not a ProcessGroup, because compiled code
holds no ProcessGroup objects; their collectives are functional (`_c10d_functional`), which dynamo keeps
inside a compiled layer's graph. Each collective is split into start and wait so that work issued
between the two may overlap it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .quantize import TOKEN_BLOCK


@dataclass(frozen=True)
class Local:
    """No communication."""

    world: int = 1

    @staticmethod
    def out_rows(rows: int) -> int:
        return rows

    def gather_start(self, tensors, dim: int):
        return list(tensors)

    def gather_wait(self, pending) -> list:
        return list(pending)

    def reduce_scatter_start(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def reduce_scatter_wait(self, t: torch.Tensor) -> torch.Tensor:
        return t


LOCAL = Local()


@dataclass(frozen=True)
class SequenceParallel:
    """The input is this rank's shard (dim 0) of a sequence split over the group `group` of `world` ranks;
    `rank` is this rank's place in it, `overlap` whether the gather is pipelined with the GEMM."""

    group: str
    world: int
    rank: int = 0
    overlap: bool = False

    @staticmethod
    def takes(granularity: str, x: torch.Tensor) -> bool:
        """Whether quantize-then-gather is exact for this input: per-token groups, 128-token shards."""
        return granularity == "token" and (x.numel() // x.shape[-1]) % TOKEN_BLOCK == 0

    def out_rows(self, rows: int) -> int:
        """The output's leading size for an input shard of `rows`: the whole sequence."""
        return rows * self.world

    def gather_start(self, tensors, dim: int) -> list:
        """Starts one all-gather of every rank's tensors (an FP8 operand's data and scales), each to be
        concatenated along dim (0 or 1) in rank order by gather_wait. One coalesced collective, not one per
        tensor: each collective costs the host far more than a kernel launch, and the step issues this per layer.

        Everything moves as bytes (collectives have no FP8 type). A transposed view (the outer-dim-major
        token scales) is gathered through its storage, so the result keeps the layout the GEMM op expects.
        """
        raws, meta = [], []
        for t in tensors:
            flip = t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous()
            if flip:
                t = t.t()
            # flat bytes: one dtype (gloo's coalesced gather garbles mixed ones), and a (n, 1) tensor's
            # stride of n in its last dim cannot be viewed as bytes
            raws.append(t.contiguous().reshape(-1).view(torch.uint8))
            meta.append((1 - dim if flip else dim, flip, t.dtype, t.shape[0]))
        outs = torch.ops._c10d_functional.all_gather_into_tensor_coalesced(raws, self.world, self.group)
        return [(out, *m) for out, m in zip(outs, meta)]

    def gather_wait(self, pending) -> list:
        return [self._gathered(*p) for p in pending]

    def gather_consume(self, tensors, consume) -> list:
        """consume(blocks, r) for every rank r's tensors (rows of a dim-0 gather, each in its own layout),
        this rank's first, while the others' are on the wire, then the rest in rank order. Returns the
        gathered tensors whole (as gather_wait would) where they are row-major, else None."""
        pending = self.gather_start(tensors, 0)
        consume(list(tensors), self.rank)
        gathered = [self._blocks(*p) for p in pending]
        for r in range(self.world):
            if r != self.rank:
                consume([blocks[r] for _, blocks in gathered], r)
        return [whole for whole, _ in gathered]

    def _blocks(self, out, dim: int, flip: bool, dtype: torch.dtype, rows: int) -> tuple:
        """A dim-0 gather whole (None for a transposed view) and each rank's tensor, as views of the
        gathered bytes (no copy)."""
        out = torch.ops._c10d_functional.wait_tensor(out).view(self.world, rows, -1).view(dtype)
        if flip:
            return None, [o.t() for o in out.unbind(0)]
        return out.view(self.world * rows, -1), list(out.unbind(0))

    def produce_scatter(self, produce, rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
        """This rank's rows [rows, cols] of the sum over ranks of the [world * rows, cols] products that
        produce(r, out) writes block by block (block r: the rows rank r keeps): the other ranks' blocks
        first, sent in one all-to-all while this rank's block is produced, then added to it."""
        peers = [r for r in range(self.world) if r != self.rank]
        send = like.new_empty((len(peers) * rows, cols))
        for i, r in enumerate(peers):
            produce(r, send[i * rows:(i + 1) * rows])
        split = [0 if r == self.rank else rows for r in range(self.world)]
        recv = torch.ops._c10d_functional.all_to_all_single(send, split, split, self.group)
        own = like.new_empty((rows, cols))
        produce(self.rank, own)
        recv = torch.ops._c10d_functional.wait_tensor(recv)
        for i in range(len(peers)):
            own += recv[i * rows:(i + 1) * rows]
        return own

    def _gathered(self, out, dim: int, flip: bool, dtype: torch.dtype, rows: int) -> torch.Tensor:
        out = torch.ops._c10d_functional.wait_tensor(out).view(rows * self.world, -1)  # the ranks' rows, stacked
        if dim == 1:
            out = torch.cat(out.chunk(self.world, 0), dim=1)
        out = out.view(dtype)
        return out.t() if flip else out

    def reduce_scatter_start(self, t: torch.Tensor) -> torch.Tensor:
        """Starts this rank's sequence shard of the sum of every rank's t (dgrad of the all-gather)."""
        return torch.ops._c10d_functional.reduce_scatter_tensor(t.contiguous(), "sum", self.world, self.group)

    def reduce_scatter_wait(self, t: torch.Tensor) -> torch.Tensor:
        return torch.ops._c10d_functional.wait_tensor(t)


@dataclass(frozen=True)
class ScatterOutput:
    """A row-parallel layer's output reduce-scattered to sequence shards inside the core (see the module
    docstring); `sp` is the same group as a SequenceParallel with overlap, whose pipelines it runs."""

    sp: SequenceParallel

    @property
    def world(self) -> int:
        return self.sp.world

    def takes(self, input_granularity: str, grad_granularity: str, x: torch.Tensor) -> bool:
        """Whether dY's shard may be quantized before its gather (per-token groups, 128-token shards) and
        the sequence splits evenly."""
        rows = x.numel() // x.shape[-1]
        return (input_granularity == grad_granularity == "token" and x.shape[0] % self.world == 0
                and (rows // self.world) % TOKEN_BLOCK == 0)

    def out_rows(self, rows: int) -> int:
        """The output's leading size for the whole sequence's `rows`: this rank's shard."""
        return rows // self.world
