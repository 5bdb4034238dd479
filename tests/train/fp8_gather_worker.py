"""torchrun worker (2 ranks, gloo): the FP8 sequence-parallel column linear (quantize, then all-gather FP8)
vs the same TP layer fed the BF16/FP32 all-gathered input (gather, then quantize), as megatron does;
for per-token recipes also the traced path (functional collectives), eager and compiled as one graph,
against the eager Function bit for bit.

Run by test_fp8_training.py; prints one JSON line per rank.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

from infir.fp8 import WeightCache, get_recipe
from infir.fp8 import linear as fp8_linear
from infir.fp8.traced import traced_linear
from infir.model.fp8_linears import Fp8GatheredColumn

recipe_name = sys.argv[1]
on_gpu = sys.argv[2:] == ["cuda"]  # NCCL, BF16 activations, Triton + scaled_mm, inductor; else gloo, FP32, emulated
dist.init_process_group("nccl" if on_gpu else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if on_gpu else torch.device("cpu")
if on_gpu:
    torch.cuda.set_device(device)
torch.manual_seed(0)
s, b, k, n = 128, 2, 256, 512   # 256 tokens per rank align with 128-token groups; 256 output columns per rank too
x_full = (torch.randn(s * world, b, k) * 3).to(device, torch.bfloat16 if on_gpu else torch.float32)
w = (torch.randn(n, k) * 0.05).to(device)
recipe = get_recipe(recipe_name)

gathered_dtypes = []
real_all_gather = dist.all_gather
dist.all_gather = lambda out, t, group=None: (gathered_dtypes.append(str(t.dtype)), real_all_gather(out, t, group=group))[1]

g = torch.randn(s * world, b, n).to(device, x_full.dtype)
cols = slice(rank * n // world, (rank + 1) * n // world)   # this rank's column shard of W (and of Y)
x_local = x_full[rank * s:(rank + 1) * s].clone().requires_grad_(True)
w_tp = w[cols].clone().requires_grad_(True)
y = Fp8GatheredColumn.apply(x_local, w_tp, None, recipe, WeightCache(), dist.group.WORLD)
dist.all_gather = real_all_gather
y.backward(g[..., cols])

x_ref = x_full.clone().requires_grad_(True)          # the gathered input, as megatron's all-gather gives it
w_ref = w[cols].clone().requires_grad_(True)
y_ref = fp8_linear(x_ref, w_ref, None, recipe, weight_cache=WeightCache())
y_ref.backward(g[..., cols])
dist.all_reduce(x_ref.grad)                          # megatron's reduce-scatter of the partial dX, whole
dx_ref = x_ref.grad[rank * s:(rank + 1) * s]
result = {
    "rank": rank,
    "y": ((y - y_ref).norm() / y_ref.norm()).item(),
    "dx": ((x_local.grad - dx_ref).norm() / dx_ref.norm()).item(),
    "dw": ((w_tp.grad - w_ref.grad).norm() / w_ref.grad.norm()).item(),
    "gathered": sorted(set(gathered_dtypes)),
}
if recipe.activation == "token":
    group = dist.group.WORLD.group_name
    for name, fn in [("traced_eager", traced_linear),
                     ("traced_compiled", torch.compile(traced_linear, backend="inductor" if on_gpu else "aot_eager", fullgraph=True))]:
        xt = x_local.detach().clone().requires_grad_(True)
        wt = w[cols].clone().requires_grad_(True)
        cache = WeightCache()
        yt = fn(xt, wt, cache.get(wt, recipe), None, recipe, group, world)
        yt.backward(g[..., cols])
        result[name] = [torch.equal(a, b) for a, b in ((yt, y), (xt.grad, x_local.grad), (wt.grad, w_tp.grad))]
report = json.dumps(result)
for r in range(world):  # one whole line per rank, in turn (the ranks share one stdout pipe)
    if r == rank:
        print(report, flush=True)
    dist.barrier()
dist.destroy_process_group()
