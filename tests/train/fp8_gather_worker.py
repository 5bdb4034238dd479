"""torchrun worker (2 ranks, gloo or NCCL): the FP8 core's sequence-parallel strategies against the same TP
layers run as megatron does, eager and compiled as one graph (bit for bit):
- column (QKV, FC1): quantize the local shard and all-gather the FP8 bytes + scales, whole
  (`SequenceParallel`) or split per rank around the GEMM (`overlap`), vs the layer fed the all-gathered
  input (gather, then quantize);
- row (proj, FC2): the GEMM split per rank around the reduce-scatter of its output, and dY's FP8
  operands gathered in backward (`SequenceParallelOutput`), vs the layer's partial product all-reduced.

Run by test_fp8_training.py; prints one JSON line per rank.
"""
import os
import sys

import torch
import torch.distributed as dist
from trainrun import print_rows

from infir.fp8 import LinearSpec, SequenceParallel, SequenceParallelOutput, WeightCache, fp8_linear, get_recipe
from infir.fp8 import linear as gathered_linear

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
comm = SequenceParallel(dist.group.WORLD.group_name, world)
gathered_dtypes = set()  # what the strategy puts on the wire, seen in the eager run
real_gather_start = SequenceParallel.gather_start


def recording_gather_start(self, tensors, dim):
    tensors = list(tensors)
    gathered_dtypes.update(str(t.dtype) for t in tensors)
    return real_gather_start(self, tensors, dim)


g = torch.randn(s * world, b, n).to(device, x_full.dtype)
cols = slice(rank * n // world, (rank + 1) * n // world)   # this rank's column shard of W (and of Y)
ks = slice(rank * k // world, (rank + 1) * k // world)     # this rank's K-shard of W (row-parallel)
rows = slice(rank * s, (rank + 1) * s)                     # this rank's sequence shard


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def column_reference():
    x_ref = x_full.clone().requires_grad_(True)          # the gathered input, as megatron's all-gather gives it
    w_ref = w[cols].clone().requires_grad_(True)
    y_ref = gathered_linear(x_ref, w_ref, None, recipe, weight_cache=WeightCache())
    y_ref.backward(g[..., cols])
    dist.all_reduce(x_ref.grad)                          # megatron's reduce-scatter of the partial dX, whole
    return y_ref.detach(), x_ref.grad[rows], w_ref.grad


def row_reference():
    x_ref = x_full[..., ks].clone().requires_grad_(True)  # every token, this rank's K-shard
    w_ref = w[:, ks].clone().requires_grad_(True)
    y_ref = gathered_linear(x_ref, w_ref, None, recipe, weight_cache=WeightCache())
    y_ref.backward(g)                                     # the all-gathered dY, as megatron's backward gives it
    y_ref = y_ref.detach()
    dist.all_reduce(y_ref)                                # the partial products summed: then this rank's rows
    return y_ref[rows], x_ref.grad, w_ref.grad


def run(comm, x_in, w_in, g_in):
    def sp_linear(x, weight, wq):
        return fp8_linear(x, weight, wq, None, LinearSpec.of(recipe, wq.granularity, comm))

    runs = {}
    for name, fn in [("eager", sp_linear),
                     ("compiled", torch.compile(sp_linear, backend="inductor" if on_gpu else "aot_eager", fullgraph=True))]:
        SequenceParallel.gather_start = recording_gather_start if name == "eager" else real_gather_start
        xt = x_in.clone().requires_grad_(True)
        wt = w_in.clone().requires_grad_(True)
        yt = fn(xt, wt, WeightCache().get(wt, recipe))
        yt.backward(g_in)
        runs[name] = (yt.detach(), xt.grad, wt.grad)
    return runs


group = dist.group.WORLD.group_name
cases = {
    "column": (SequenceParallel(group, world), x_full[rows], w[cols], g[..., cols], column_reference),
    "column_overlap": (SequenceParallel(group, world, overlap=True), x_full[rows], w[cols], g[..., cols], column_reference),
    "row_overlap": (SequenceParallelOutput(group, world), x_full[..., ks], w[:, ks], g[rows], row_reference),
}
result = {"rank": rank, "takes": SequenceParallel.takes(recipe.input.granularity, s * b)}
for case, (comm, x_in, w_in, g_in, reference) in cases.items():
    gathered_dtypes.clear()
    y_ref, dx_ref, dw_ref = reference()
    runs = run(comm, x_in, w_in, g_in)
    y, dx, dw = runs["eager"]
    result[case] = dict(y=rel(y, y_ref), dx=rel(dx, dx_ref), dw=rel(dw, dw_ref),
                        compiled_equal=[torch.equal(a, b) for a, b in zip(runs["compiled"], runs["eager"])],
                        gathered=sorted(gathered_dtypes))
print_rows(result)
dist.destroy_process_group()
