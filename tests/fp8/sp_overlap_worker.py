"""torchrun worker: infir.fp8.sp_overlap's split gathers against one all-gather, per transport. Each rank's
rows of a product are made by `mm` as the rows arrive, and every rank's tensors come back in rank order.

- gloo (CPU): the all-to-all exchanges.
- NCCL (GPUs of one host): the exchanges and the copy engines' pulls and pushes over symmetric memory,
  eagerly (back-to-back calls with new data each: a rank must not refill its mapped buffer before the
  others are done with it; a call larger than the buffer so far: a new one is mapped) and replayed from a
  CUDA graph whose inputs change between replays.
Reduce-scatters likewise, against one reduce-scatter.

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


def operands(m: int, seed: int, blocks: int = 2):
    """This rank's rows (FP8 bytes on a GPU, else FP32), their per-row scales stored outer-dim-major (a transposed
    view, as the FP8 GEMM takes them; one block: (m, 1) with strides (1, m), as gemm.outer_dim_major leaves it),
    and an extra tensor gathered beside them."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    x = torch.randn(m, 96, generator=g).to(device)
    scale = torch.rand(blocks, m, generator=g).to(device).t()  # (m, blocks), not contiguous at 2
    if blocks == 1:
        scale = scale.as_strided((m, 1), (1, m))
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
        raw = t.contiguous().reshape(-1).view(torch.uint8)  # as bytes: collectives have no FP8 type
        parts = [torch.empty_like(raw) for _ in range(world)]
        dist.all_gather(parts, raw)
        gathered.append([p.view(t.dtype).view(t.shape) for p in parts])
    everyone = [[g[j] for g in gathered] for j in range(world)]
    return torch.cat([product(e) for e in everyone]), everyone


def matches(fn, local) -> bool:
    out, everyone = split(fn, local)
    ref, ref_everyone = whole(local)
    return torch.equal(out, ref) and all(torch.equal(a, b) for e, r in zip(everyone, ref_everyone) for a, b in zip(e, r))


def reduce_scatter(fn, m: int, seed: int):
    """This rank's rows of the sum over ranks of x_r @ w^T (each rank's own x_r of W*m rows), by fn (a
    sp_overlap reduce-scatter) and by one reduce-scatter."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    x = torch.randn(world * m, 96, generator=g).to(device)
    got = fn(lambda j: x[j * m:(j + 1) * m] @ w.t(), group)
    ref = torch.empty(m, 64, device=device)
    dist.reduce_scatter_tensor(ref, x @ w.t())
    return got, ref


gathers = {"exchange": sp_overlap.exchange_gather_mm}
scatters = {"exchange": sp_overlap.exchange_mm_reduce_scatter}
if on_gpu:
    gathers["copy_engine"] = sp_overlap.copy_engine_gather_mm
    scatters["copy_engine"] = sp_overlap.copy_engine_mm_reduce_scatter
result = {"rank": rank, "shares_memory": sp_overlap.shares_memory(group)}
sizes = [128, 128, 128, 16384]  # back to back, new data each call, then a larger one (a larger buffer mapped)
for name, fn in gathers.items():
    result[name] = [matches(fn, operands(m, seed)) for seed, m in enumerate(sizes)]
    result[f"{name}_one_block"] = matches(fn, operands(128, 20, blocks=1))
sums = {name: [reduce_scatter(fn, m, seed) for seed, m in enumerate(sizes)] for name, fn in scatters.items()}
for name, runs in sums.items():
    # the partials summed in another order than NCCL's: FP32 rounding apart
    result[f"{name}_reduce_scatter"] = [torch.allclose(got, ref, rtol=1e-4, atol=1e-4) for got, ref in runs]
if on_gpu:  # both transports add the partials in the same order: the same bits
    result["reduce_scatter_transports_equal"] = [torch.equal(a[0], b[0])
                                                 for a, b in zip(sums["exchange"], sums["copy_engine"])]
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
    # the reduce-scatter replayed from a graph whose input changes between replays
    x = torch.randn(world * 256, 96, device=device)
    rs = lambda: sp_overlap.copy_engine_mm_reduce_scatter(lambda j: x[j * 256:(j + 1) * 256] @ w.t(), group)  # noqa: E731
    rs()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rs()
    replays = []
    for seed in (8, 9):
        x.copy_(torch.randn(world * 256, 96, generator=torch.Generator().manual_seed(seed + 10 * rank)).to(device))
        graph.replay()
        ref = torch.empty(256, 64, device=device)
        dist.reduce_scatter_tensor(ref, x @ w.t())
        replays.append(torch.allclose(out, ref, rtol=1e-4, atol=1e-4))
    result["graphed_reduce_scatter"] = replays
print_rows(result)
dist.destroy_process_group()
