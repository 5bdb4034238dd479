"""torchrun worker: infir.fp8.sp_overlap's split gathers against one all-gather, per transport. Each rank's
rows of a product are made by `mm` as the rows arrive, and every rank's tensors come back in rank order.

- gloo (CPU): the all-to-all exchanges.
- NCCL (two GPUs of one host): the exchanges and the copy engines' pulls over symmetric memory, eagerly
  (back-to-back calls with new data each: a rank must not refill its mapped buffer before the others pulled
  from it; a call larger than the buffer so far: a new one is mapped) and replayed from a CUDA graph whose
  inputs change between replays.

Run by test_sp_overlap.py; prints one JSON line per rank.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from trainrun import print_rows  # noqa: E402

from infir.fp8 import sp_overlap  # noqa: E402

on_gpu = sys.argv[1:] == ["cuda"]
dist.init_process_group("nccl" if on_gpu else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if on_gpu else torch.device("cpu")
if on_gpu:
    torch.cuda.set_device(device)
group = dist.group.WORLD.group_name
w = torch.randn(64, 96, generator=torch.Generator().manual_seed(1)).to(device)


def operands(m: int, seed: int):
    """This rank's rows (FP8 bytes on a GPU, else FP32), their per-row scales stored outer-dim-major (a transposed
    view, as the FP8 GEMM takes them), and an extra tensor gathered beside them."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    x = torch.randn(m, 96, generator=g).to(device)
    scale = torch.rand(2, m, generator=g).to(device).t()  # (m, 2), not contiguous
    extra = torch.randn(m, 8, generator=g).to(device)
    if on_gpu:
        x = x.to(torch.float8_e4m3fn)
    return [x, scale, extra]


def product(tensors):
    return tensors[0].float() @ w.t() * tensors[1][:, :1]


def split(fn, local):
    """fn (a sp_overlap gather) with mm writing each rank's rows of the product into its place."""
    m = local[0].shape[0]
    out = torch.empty(world * m, 64, device=device)

    def mm(j, tensors):
        out[j * m:(j + 1) * m] = product(tensors)

    everyone = fn(local, mm, group)
    return out, everyone


def whole(local):
    """The reference: every rank's tensors by one all-gather each, the product of all rows."""
    gathered = []
    for t in local:
        raw = t.contiguous().view(torch.uint8)  # as bytes: collectives have no FP8 type
        parts = [torch.empty_like(raw) for _ in range(world)]
        dist.all_gather(parts, raw)
        gathered.append([p.view(t.dtype) for p in parts])
    everyone = [[g[j] for g in gathered] for j in range(world)]
    return torch.cat([product(e) for e in everyone]), everyone


def matches(fn, local) -> bool:
    out, everyone = split(fn, local)
    ref, ref_everyone = whole(local)
    return torch.equal(out, ref) and all(torch.equal(a, b) for e, r in zip(everyone, ref_everyone) for a, b in zip(e, r))


transports = {"exchange": sp_overlap.exchange_gather_mm}
if on_gpu:
    transports["copy_engine"] = sp_overlap.copy_engine_gather_mm
result = {"rank": rank, "shares_memory": sp_overlap.shares_memory(w, world)}
for name, fn in transports.items():
    # back to back, new data each call, then a larger call (the copy engines map a larger buffer)
    result[name] = [matches(fn, operands(m, seed)) for seed, m in enumerate([128, 128, 128, 16384])]
if on_gpu:
    local = operands(256, 7)
    fn = sp_overlap.copy_engine_gather_mm
    split(fn, local)  # the mapped buffer and the pull stream, made before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = split(fn, local)
    replays = []
    for seed in (8, 9):
        for t, new in zip(local, operands(256, seed)):
            t.copy_(new)
        graph.replay()
        replays.append(torch.equal(out, whole(local)[0]))
    result["graphed"] = replays
print_rows(result)
dist.destroy_process_group()
