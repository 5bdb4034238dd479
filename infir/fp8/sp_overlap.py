"""Sequence-parallel collectives split per rank, so that each overlaps the GEMM beside it.

Under sequence parallelism each of the W tensor-parallel ranks holds m = M/W of the M tokens. A
column-parallel linear (QKV, FC1) needs every rank's rows: all-gather, then GEMM. A row-parallel one
(attention output, FC2) makes partial sums of every row, which are summed over the ranks and split by
rows: GEMM, then reduce-scatter. Their backwards swap the two. As one collective beside one GEMM, each
waits for the other and the step pays every TP collective in full. Split by rank:
- `gather_mm`: this rank's rows go to every other rank and theirs come in, one pairwise exchange per
  distance k = 1..W-1 (send to rank r+k, receive from r-k). The GEMM of the own rows runs while the
  exchanges are in flight, and each other rank's rows are multiplied as they land.
- `mm_reduce_scatter`: the partial product of the rows rank r+k owns is made and sent to it while the
  next one is made; the own rows' partial comes last, and the partials received are added to it.
How the rows move:
- Between GPUs of one host (`copy_engine_gather_mm`, `copy_engine_mm_reduce_scatter`): every rank of the
  group maps a buffer of every other (torch's symmetric memory). A gather's rows are put in the own buffer
  and pulled from the others' with cudaMemcpyAsync, a reduce-scatter's partials pushed into a slot of
  their owner's buffer as each is made; the copy engines carry both over NVLink, and no SMs are taken
  from the GEMM beside them. A collective's kernel beside a persistent cuBLAS GEMM takes SMs the GEMM was
  given, and slows it by about what it hides (bench/side_stream.py).
- Elsewhere (`exchange_gather_mm`, `exchange_mm_reduce_scatter`): an all-to-all in which every rank sends
  to one rank and receives from one (NCCL runs it as one grouped send and receive), so one rank's rows can
  be used as soon as they land, which a single all-gather (one completion for all ranks) does not give at
  W > 2. At W = 2 the bytes on the wire are those of the collective, and the sum is the same. An
  all-to-all rather than torch's point-to-point calls: a collective is what CUDA graph capture takes (the
  compiled FP8 layers replay graphs).

Why not torch's fused async TP ops: their FP8 forms take tensor- or row-wise scales only, and on an H200 at
7B TP=2 their products copied into place cost more than the overlap saved (bench/async_tp.py).

The schedules take the GEMM as a callable and know nothing of FP8: the FP8 core's graph ops (ops.py)
and the BF16 tensor-parallel linears use them alike.
"""
from __future__ import annotations

import os
from typing import Callable, Sequence

import torch
import torch.distributed as dist


def process_group(name: str):
    """The ProcessGroup a compiled graph names by string."""
    return dist.distributed_c10d._resolve_process_group(name)


def _wire_form(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(t as a contiguous tensor to move, whether it is t transposed): a transposed view (the
    outer-dim-major token scales) moves through its storage and is seen transposed again on arrival."""
    if t.is_contiguous():
        return t, False
    if t.dim() == 2 and t.t().is_contiguous():
        return t.t(), True
    return t.contiguous(), False


def _shift(t: torch.Tensor, dst: int, src: int, world: int, group: str) -> torch.Tensor:
    """Started: an all-to-all in which this rank's contiguous `t` goes to rank dst and rank src's (same shape
    and dtype) comes back, as rows of bytes (collectives have no FP8 type); `_landed` makes it `t`'s kind."""
    n = t.shape[0]
    send = [n if j == dst else 0 for j in range(world)]
    recv = [n if j == src else 0 for j in range(world)]
    # flat first: a contiguous tensor may still carry any stride on a size-1 dim (a one-block token scale's
    # (rows, 1) with stride (1, rows)), which a dtype view refuses
    rows = t.reshape(-1).view(torch.uint8).view(n, -1)
    return torch.ops._c10d_functional.all_to_all_single(rows, recv, send, group)


def _landed(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.ops._c10d_functional.wait_tensor(out).view(like.dtype).view(like.shape)


class Exchange:
    """Every other rank's copy of `tensors` (same shapes and dtypes on every rank), in flight: exchange k
    (1..W-1) sends this rank's to rank r+k and receives rank r-k's. `arrivals` yields (source rank,
    its tensors) in that order, each waited for (on a GPU, the current stream waits; the host does not)."""

    def __init__(self, tensors: Sequence[torch.Tensor], group: str):
        pg = process_group(group)
        self.world, self.rank = pg.size(), pg.rank()
        wires = [_wire_form(t) for t in tensors]
        self.flips = [flip for _, flip in wires]
        self.pending = []
        for k in range(1, self.world):
            dst, src = (self.rank + k) % self.world, (self.rank - k) % self.world
            self.pending.append((src, [_shift(w, dst, src, self.world, group) for w, _ in wires]))
        self.wires = [w for w, _ in wires]

    def arrivals(self):
        for src, outs in self.pending:
            outs = [_landed(o, w) for o, w in zip(outs, self.wires)]
            yield src, [o.t() if flip else o for o, flip in zip(outs, self.flips)]


def gather_mm(local: Sequence[torch.Tensor], mm: Callable[[int, Sequence[torch.Tensor]], None],
              group: str) -> list[list[torch.Tensor]]:
    """Calls mm(j, rank j's tensors) for every rank j of the group, this rank's own `local` first (while
    the others' rows move), the others' as they land; mm writes rank j's rows of its product itself.
    Returns every rank's tensors, in rank order (this rank's are `local` itself). Between GPUs of one
    host the rows move by copy engine, elsewhere by NCCL (or gloo) exchanges."""
    if shares_memory(group):
        return copy_engine_gather_mm(local, mm, group)
    return exchange_gather_mm(local, mm, group)


def shares_memory(group: str) -> bool:
    """Whether the group's GPUs can map each other's memory: an NCCL group whose ranks are processes of one
    host (on_one_host)."""
    pg = process_group(group)
    # the ranks first: gloo runs (CPU tests) then read the same group's ranks that NCCL runs do
    return on_one_host(dist.get_process_group_ranks(pg), int(os.environ.get("LOCAL_WORLD_SIZE", "0"))) \
        and dist.get_backend(pg) == "nccl"


def on_one_host(ranks: Sequence[int], local_world: int) -> bool:
    """Whether these global ranks are processes of one host, where torchrun numbers each host's `local_world`
    processes consecutively. A group of consecutive ranks (megatron's tensor-parallel groups) can still straddle
    two hosts when its size does not divide local_world. Unknown (local_world 0, not under torchrun): no."""
    return local_world > 0 and len({r // local_world for r in ranks}) == 1


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream the copy engines' pulls and pushes are issued on."""
    if device not in _SIDE:
        _SIDE[device] = torch.cuda.Stream(device)
    return _SIDE[device]


_ALIGN = 256  # bytes between the tensors of one rank's rows in the mapped buffer
_MAPPED: dict[str, tuple[torch.Tensor, object]] = {}  # group -> (its buffer, the group's handle to it)
_RESERVED: set[str] = set()  # groups whose buffer was mapped ahead (reserve) and may not grow
# Buffers outgrown by a larger one stay allocated: a CUDA graph captured while one was current replays its address.
_OUTGROWN: list = []
_SIDE: dict[torch.device, torch.cuda.Stream] = {}


class MappingUnavailable(RuntimeError):
    """The GPUs of a group could not map each other's memory (symmetric memory)."""


def reserve(group: str, nbytes: int, device: torch.device) -> None:
    """Maps the group's buffer ahead, at least `nbytes` (growing one reserved before, for a model with
    longer micro-batches in the same process), and keeps it from growing inside the schedules. Compiled
    layers that replay CUDA graphs need this: mapping allocates small device arrays through the caching
    allocator, and a first call inside a compiled region's warm-up run would leave them in the graphs'
    pool, which torch rejects. A collective, as _mapped_buffer."""
    _RESERVED.discard(group)
    _mapped_buffer(group, nbytes, device)
    _RESERVED.add(group)


def _mapped_buffer(group: str, nbytes: int, device: torch.device):
    """The group's symmetric-memory handle to a buffer of at least `nbytes` on every rank. Making one is a
    collective (every rank maps every other's): all ranks come here with the same sizes, in the same order."""
    held = _MAPPED.get(group)
    if held is None or held[0].numel() < nbytes:
        from torch.distributed import _symmetric_memory as symm_mem

        if group in _RESERVED:
            raise RuntimeError(f"sp_overlap: group {group} needs a {nbytes}-byte mapped buffer, more than the "
                               f"{held[0].numel()} reserved for it (sp_overlap.reserve's caller undercounted)")
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"sp_overlap: a {nbytes}-byte mapped buffer for group {group} was first needed inside "
                               "CUDA graph capture; run the step once without capture first")
        size = 1 << max(20, (nbytes - 1).bit_length())  # powers of two: few buffers outgrown on the way up
        try:
            buf = symm_mem.empty(size, dtype=torch.uint8, device=device)
            handle = symm_mem.rendezvous(buf, group)
        except RuntimeError as e:
            raise MappingUnavailable(f"the GPUs of tensor-parallel group {group} could not map each other's memory "
                                     f"({e}); run with parallel.tp_comm_overlap=false") from e
        if held is not None:
            _OUTGROWN.append(held)
        held = _MAPPED[group] = (buf, handle)
    return held[1]


def copy_engine_gather_mm(local: Sequence[torch.Tensor], mm: Callable[[int, Sequence[torch.Tensor]], None],
                          group: str) -> list[list[torch.Tensor]]:
    """gather_mm over symmetric memory: this rank's tensors copied into its mapped buffer, a barrier, then
    each other rank's pulled from its buffer on a side stream while the own rows' GEMM runs, each other
    rank's GEMM once its rows are in. The barrier at the start of the next call keeps a rank from
    overwriting its buffer before every rank has pulled from it (each rank's barrier follows its pulls on
    the current stream)."""
    pg = process_group(group)
    world, rank = pg.size(), pg.rank()
    wires = [_wire_form(t) for t in local]
    flips = [flip for _, flip in wires]
    wires = [w for w, _ in wires]
    offsets, end = [], 0
    for w in wires:
        offsets.append(end)
        end += -(-w.numel() * w.element_size() // _ALIGN) * _ALIGN
    device = wires[0].device
    handle = _mapped_buffer(group, end, device)

    def mapped(j: int) -> list[torch.Tensor]:  # rank j's tensors in its buffer
        return [handle.get_buffer(j, w.shape, w.dtype, off // w.element_size()) for w, off in zip(wires, offsets)]

    current = torch.cuda.current_stream(device)
    pulls = _side_stream(device)
    handle.barrier(channel=0)
    for dst, w in zip(mapped(rank), wires):
        dst.copy_(w)
    handle.barrier(channel=1)
    pulls.wait_stream(current)
    arrivals = []  # pulls issued before the own rows' GEMM: under one hardware queue they are not queued behind it
    for k in range(1, world):
        src = (rank - k) % world
        outs = [torch.empty_like(w) for w in wires]  # made on the current stream, which waits for the pull
        with torch.cuda.stream(pulls):
            for out, remote in zip(outs, mapped(src)):
                out.copy_(remote)
            landed = torch.cuda.Event()
            landed.record(pulls)
        arrivals.append((src, outs, landed))
    mm(rank, local)
    everyone = {rank: list(local)}
    for src, outs, landed in arrivals:
        current.wait_event(landed)
        tensors = [o.t() if flip else o for o, flip in zip(outs, flips)]
        mm(src, tensors)
        everyone[src] = tensors
    return [everyone[j] for j in range(world)]


def exchange_gather_mm(local: Sequence[torch.Tensor], mm: Callable[[int, Sequence[torch.Tensor]], None],
                       group: str) -> list[list[torch.Tensor]]:
    """gather_mm over all-to-all exchanges (module docstring)."""
    exchange = Exchange(local, group)
    mm(exchange.rank, local)
    everyone = {exchange.rank: list(local)}
    for src, tensors in exchange.arrivals():
        mm(src, tensors)
        everyone[src] = tensors
    return [everyone[j] for j in range(exchange.world)]


def mm_reduce_scatter(mm: Callable[[int], torch.Tensor], group: str) -> torch.Tensor:
    """This rank's rows of the sum over the group's ranks of their partial products: mm(j) is this
    rank's partial product of the rows rank j owns (a new tensor). Each other rank's partial is made and
    sent while the next is made; the sum is the own partial plus the received ones, in exchange order
    (rank r-1's first, then r-2's, ...). Between GPUs of one host the partials move by copy engine,
    elsewhere by NCCL (or gloo) exchanges."""
    if shares_memory(group):
        return copy_engine_mm_reduce_scatter(mm, group)
    return exchange_mm_reduce_scatter(mm, group)


def exchange_mm_reduce_scatter(mm: Callable[[int], torch.Tensor], group: str) -> torch.Tensor:
    """mm_reduce_scatter over all-to-all exchanges (module docstring)."""
    pg = process_group(group)
    world, rank = pg.size(), pg.rank()
    pending = []
    for k in range(1, world):
        dst, src = (rank + k) % world, (rank - k) % world
        part = mm(dst)
        pending.append((_shift(part, dst, src, world, group), part))
    out = mm(rank)
    for sent, part in pending:
        out += _landed(sent, part)
    return out


def copy_engine_mm_reduce_scatter(mm: Callable[[int], torch.Tensor], group: str) -> torch.Tensor:
    """mm_reduce_scatter over symmetric memory: each partial, once made, pushed by cudaMemcpyAsync into
    the slot for this rank in its owner's mapped buffer, on a side stream while the next is made; a
    barrier once every push has landed, then the own partial plus the slots. The barrier at the start
    (after the first partial's GEMM) keeps a rank from pushing into a buffer its owner is still summing."""
    pg = process_group(group)
    world, rank = pg.size(), pg.rank()
    first = mm((rank + 1) % world)
    slot = -(-first.numel() * first.element_size() // _ALIGN) * _ALIGN
    handle = _mapped_buffer(group, world * slot, first.device)

    def slot_of(owner: int, src: int) -> torch.Tensor:  # where src's partial for `owner` lands
        return handle.get_buffer(owner, first.shape, first.dtype, src * slot // first.element_size())

    current, pushes = torch.cuda.current_stream(first.device), _side_stream(first.device)
    handle.barrier(channel=0)
    parts = []  # kept until the current stream has waited for their pushes
    for k in range(1, world):
        dst = (rank + k) % world
        part = first if k == 1 else mm(dst)
        pushes.wait_stream(current)
        with torch.cuda.stream(pushes):
            slot_of(dst, rank).copy_(part)
        parts.append(part)
    out = mm(rank)
    current.wait_stream(pushes)
    handle.barrier(channel=1)
    for k in range(1, world):
        out += slot_of(rank, (rank - k) % world)
    return out


def concat_rows(parts: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """The ranks' pieces of one tensor joined along `dim` (0 or 1), keeping an outer-dim-major layout
    (a transposed contiguous 2-D view) outer-dim-major, as the FP8 GEMM takes token scales."""
    if parts[0].dim() == 2 and not parts[0].is_contiguous() and parts[0].t().is_contiguous():
        return torch.cat([p.t() for p in parts], dim=1 - dim).t()
    return torch.cat(list(parts), dim=dim)
