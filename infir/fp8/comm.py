"""What moves between ranks around an FP8 linear's GEMMs: a strategy object the linear core calls.

The core (linear.Fp8LinearFunction) runs the same three GEMMs whatever the parallelism; around them a
strategy says what the input and its gradient go through:
- `LOCAL`: nothing moves (a single rank, a row-parallel layer, or a column-parallel layer whose input
  megatron already gathered).
- `SequenceParallel(group, world, overlap)`: the input is this rank's shard of the sequence (a
  column-parallel layer). Its FP8 operand (bytes + scales) is all-gathered for fprop (half the bytes of
  gathering BF16), X^T's shards are kept local and gathered only in backward (half the saved memory at
  TP=2), and dgrad's dX is reduce-scattered back to the shards. With `overlap` each is split per rank
  around its GEMM (sp_overlap.py): the fprop gather, dX's reduce-scatter around dgrad, X^T's gather
  around wgrad; without, the backward's gather and reduce-scatter are started before dgrad and wgrad and
  waited for after them.
- `SequenceParallelOutput(group, world)`: the output is reduce-scattered to this rank's shard of the
  sequence (a row-parallel layer), split per rank around the fprop GEMM; in backward dY's shards come
  in as FP8 operands (dY along N for dgrad, split per rank around it, and dY^T for wgrad), half the
  bytes of megatron's BF16 all-gather.
Quantize-then-gather equals megatron's gather-then-quantize when no quantization group straddles two
shards: per-token groups never do along K, and 128-token groups along the tokens (X^T, dY^T) line up
when each shard holds a multiple of 128 tokens (`takes` checks it).

Strategies are frozen dataclasses holding the group's *name*, not a ProcessGroup, because compiled code
holds no ProcessGroup objects; their collectives are functional (`_c10d_functional`), which dynamo keeps
inside a compiled layer's graph. Each collective is split into start and wait so that work issued
between the two may overlap it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .ops import fp8_gather_mm, fp8_gather_wgrad, fp8_mm, fp8_mm_reduce_scatter
from .quantize import TOKEN_BLOCK


@dataclass(frozen=True)
class Local:
    """No communication."""

    world: int = 1

    def rows(self, rows: int) -> int:
        """The rows of the output for `rows` rows of input."""
        return rows

    def forward_mm(self, a, a_scale, a_gran: str, b, b_scale, b_gran: str, out_dtype: torch.dtype, b_mm_scale):
        """fprop's GEMM with what moves around it: A @ B^T here."""
        return fp8_mm(a, a_scale, a_gran, b, b_scale, b_gran, out_dtype, False, b_mm_scale)

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
    """The input is this rank's shard (dim 0) of a sequence split over the group `group` of `world` ranks."""

    group: str
    world: int
    overlap: bool = False

    @staticmethod
    def takes(granularity: str, tokens: int) -> bool:
        """Whether quantize-then-gather is exact for shards of `tokens` tokens: per-token groups, 128-token shards."""
        return granularity == "token" and tokens % TOKEN_BLOCK == 0

    def rows(self, rows: int) -> int:
        return rows * self.world

    def forward_mm(self, a, a_scale, a_gran: str, b, b_scale, b_gran: str, out_dtype: torch.dtype, b_mm_scale):
        """Every rank's A rows @ B^T: the gather split per rank around the GEMM (overlap), or whole before it."""
        if self.overlap:
            return fp8_gather_mm(a, a_scale, a_gran, b, b_scale, b_gran, out_dtype, False, b_mm_scale, self.group,
                                 self.world, [], [])[0]
        a, a_scale = self.gather_wait(self.gather_start((a, a_scale), 0))
        return fp8_mm(a, a_scale, a_gran, b, b_scale, b_gran, out_dtype, False, b_mm_scale)

    def dgrad_mm(self, dy, dy_scale, dy_gran: str, w, w_scale, w_gran: str, out_dtype: torch.dtype, w_mm_t):
        """This rank's shard of dX = dY @ W summed over the group (overlap): dX's reduce-scatter split per rank
        around the dgrad GEMM, dY's rows one destination rank at a time."""
        return fp8_mm_reduce_scatter(dy, dy_scale, dy_gran, w, w_scale, w_gran, out_dtype, True, w_mm_t, self.group,
                                     self.world)

    def gather_wgrad(self, dyt, dyt_scale, dyt_gran: str, xt, xt_scale, xt_gran: str, weight):
        """dW from dY^T (every token) and X^T's shards (overlap): X^T's gather split per rank around the wgrad
        GEMMs, into `weight`'s main_grad (a placeholder returned) or, with weight None, as FP32."""
        return fp8_gather_wgrad(dyt, dyt_scale, dyt_gran, xt, xt_scale, xt_gran, weight, self.group, self.world)

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
class SequenceParallelOutput:
    """The output is this rank's shard (dim 0) of the sum over the group's ranks (a row-parallel layer's
    reduce-scatter), the input every token of this rank's K-shard."""

    group: str
    world: int

    def rows(self, rows: int) -> int:
        return rows // self.world

    def forward_mm(self, a, a_scale, a_gran: str, b, b_scale, b_gran: str, out_dtype: torch.dtype, b_mm_scale):
        return fp8_mm_reduce_scatter(a, a_scale, a_gran, b, b_scale, b_gran, out_dtype, False, b_mm_scale, self.group,
                                     self.world)

    def gather_dgrad(self, dy, dy_scale, dy_gran: str, w, w_scale, w_gran: str, out_dtype: torch.dtype, w_mm_t,
                     extra: list):
        """dgrad over every rank's dY rows (dY gathered per rank around the GEMMs), and `extra` (dY^T's
        data and scale) gathered along the tokens."""
        return fp8_gather_mm(dy, dy_scale, dy_gran, w, w_scale, w_gran, out_dtype, True, w_mm_t, self.group, self.world,
                             extra, [1] * len(extra))

    def gather(self, tensors: list) -> list:
        """Every rank's `tensors` (dY^T's data and scale) joined along the tokens, where no dgrad needs dY."""
        sp = SequenceParallel(self.group, self.world)
        return sp.gather_wait(sp.gather_start(tensors, 1))
