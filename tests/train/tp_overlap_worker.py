"""torchrun worker (2 ranks, gloo or NCCL): the FP8 core's sequence-parallel communication pipelined with its
GEMMs (parallel.tp_comm_overlap) against the same layers without the pipelines.

- column-parallel (QKV, FC1): SequenceParallel(overlap=True), the gather pipelined with fprop, against the
  gather-then-GEMM strategy: output and both gradients;
- row-parallel (proj, FC2): ScatterOutput, the GEMM pipelined with its reduce-scatter and dY's FP8 gather
  pipelined with dgrad, against the local GEMM followed by megatron's reduce-scatter (BF16 / FP32 partial
  sums; its backward gathers dY in that dtype);
each eager and compiled as one graph; then a tiny TP=2 + SP model, FP8 (SwiGLU's FP8 output into FC2's
pipeline included) and BF16, with and without build_gpt's tp_comm_overlap: loss and every gradient, and
how often each pipeline ran. Run by test_tp_overlap.py; prints one JSON line per rank.
"""
import os
import sys

import torch
import torch.distributed as dist
from trainrun import print_rows
from megatron.core.tensor_parallel.mappings import reduce_scatter_to_sequence_parallel_region

from infir.fp8 import LOCAL, LinearSpec, ScatterOutput, SequenceParallel, WeightCache, fp8_linear, get_recipe
from infir.fp8 import comm as comm_module
from infir.model import cpu_shims, pipelined_tp  # noqa: F401  (its ops are counted below)

recipe_name = sys.argv[1]
on_gpu = sys.argv[2:] == ["cuda"]  # NCCL, BF16 activations, Triton + scaled_mm, inductor; else gloo, FP32, emulated
cpu_shims.install()  # megatron's mappings allocate on torch.cuda.current_device()
dist.init_process_group("nccl" if on_gpu else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if on_gpu else torch.device("cpu")
if on_gpu:
    torch.cuda.set_device(device)
group = dist.group.WORLD
torch.manual_seed(0)
s, b, k, n = 128, 2, 256, 512   # 256 tokens per rank align with 128-token groups
dtype = torch.bfloat16 if on_gpu else torch.float32
recipe = get_recipe(recipe_name)
plain = SequenceParallel(group.group_name, world, rank)
piped = SequenceParallel(group.group_name, world, rank, overlap=True)
scatter = ScatterOutput(piped)
compile_backend = "inductor" if on_gpu else "aot_eager"

wire = set()  # the dtypes the pipelines gather, seen in the eager runs
real_gather_start = SequenceParallel.gather_start


def recording_gather_start(self, tensors, dim):
    tensors = list(tensors)
    wire.update(str(t.dtype) for t in tensors)
    return real_gather_start(self, tensors, dim)


def run(fn, x, w, g, compiled: bool):
    """y, dx, dw of fn(x, w, weight cache) for the output gradient g."""
    SequenceParallel.gather_start = real_gather_start if compiled else recording_gather_start
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    f = torch.compile(fn, backend=compile_backend, fullgraph=True) if compiled else fn
    y = f(x, w, WeightCache().get(w, recipe))
    y.backward(g)
    return [t.detach() for t in (y, x.grad, w.grad)]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def column(comm):
    return lambda x, w, wq: fp8_linear(x, w, wq, None, LinearSpec.of(recipe, wq.granularity, comm))


def row_then_reduce_scatter(x, w, wq):
    """megatron's row-parallel layer: the local GEMM's partial sums, then its reduce-scatter."""
    return reduce_scatter_to_sequence_parallel_region(fp8_linear(x, w, wq, None, LinearSpec.of(recipe, wq.granularity)),
                                                      group=group)


result = {"rank": rank}
x_shard = (torch.randn(s, b, k) * 3).to(device, dtype)          # this rank's tokens
w_col = (torch.randn(n // world, k) * 0.05).to(device)           # this rank's output columns
g_col = torch.randn(s * world, b, n // world).to(device, dtype)
ref = run(column(plain), x_shard, w_col, g_col, False)
wire.clear()
for mode in ("eager", "compiled"):
    got = run(column(piped), x_shard, w_col, g_col, mode == "compiled")
    result[f"column_{mode}"] = [torch.equal(a, b) for a, b in zip(got, ref)]
    result[f"column_{mode}_rel"] = [rel(a, b) for a, b in zip(got, ref)]
result["column_wire"] = sorted(wire)

x_full = (torch.randn(s * world, b, k // world) * 3).to(device, dtype)   # the whole sequence, this rank's K columns
w_row = (torch.randn(n, k // world) * 0.05).to(device)
g_row = torch.randn(s, b, n).to(device, dtype)                            # dY of this rank's output shard
result["row_takes"] = scatter.takes(recipe.input.granularity, recipe.grad_output.granularity, x_full)
ref = run(row_then_reduce_scatter, x_full, w_row, g_row, False)
wire.clear()
for mode in ("eager", "compiled"):
    got = run(column(scatter), x_full, w_row, g_row, mode == "compiled")
    result[f"row_{mode}_rel"] = [rel(a, b) for a, b in zip(got, ref)]
    result[f"row_{mode}_shape"] = list(got[0].shape) == list(ref[0].shape)
result["row_wire"] = sorted(wire)
result["no_bias"] = False
try:
    fp8_linear(x_full, w_row, WeightCache().get(w_row, recipe), torch.zeros(n, device=device),
               LinearSpec.of(recipe, "block", scatter))
except ValueError as e:
    result["no_bias"] = "bias" in str(e)
assert comm_module.LOCAL is LOCAL


def model_run(overlap: bool, fp8: bool):
    """Loss and gradients of a tiny TP=2 + SP model (FP8 or BF16 projections), counting the pipelined ops
    it calls."""
    from infir.model import build_gpt, get_size, transformer_config

    # the package's name `linear` is the function
    mods = {"fp8": sys.modules["infir.fp8.linear"], "bf16": sys.modules["infir.model.pipelined_tp"]}
    names = {"fp8": ("fp8_gather_mm", "fp8_mm_scatter"), "bf16": ("gather_mm_whole", "mm_scatter")}
    calls = {f"{kind}.{name}": 0 for kind, ns in names.items() for name in ns}
    real = {key: getattr(mods[key.split(".")[0]], key.split(".")[1]) for key in calls}

    def counting(key):
        def op(*args):
            calls[key] += 1
            return real[key](*args)
        return op

    for key in calls:
        setattr(mods[key.split(".")[0]], key.split(".")[1], counting(key))
    try:
        size = get_size("tiny")
        torch.manual_seed(1)
        model = build_gpt(size, transformer_config(size, tp=world, sequence_parallel=True,
                                                   autocast_dtype=torch.bfloat16 if on_gpu else None),
                          recipe if fp8 else None, seq_length=512, tp_comm_overlap=overlap).to(device)
        tokens = torch.randint(0, size.vocab, (2, 512), generator=torch.Generator().manual_seed(2)).to(device)
        positions = torch.arange(512, device=device).expand_as(tokens)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
            loss = model(tokens, positions, None, labels=tokens).float().mean()
        loss.backward()
        grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
        return loss.item(), grads, calls
    finally:
        for key in calls:
            setattr(mods[key.split(".")[0]], key.split(".")[1], real[key])


from megatron.core import parallel_state  # noqa: E402

parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
for kind, fp8 in (("model", True), ("bf16_model", False)):
    loss_a, grads_a, calls_a = model_run(False, fp8)
    loss_b, grads_b, calls_b = model_run(True, fp8)
    result.update({f"{kind}_loss": [loss_a, loss_b], f"{kind}_calls": [calls_a, calls_b],
                   f"{kind}_grads_rel": max(rel(grads_b[k], grads_a[k]) for k in grads_a),
                   f"{kind}_grad_names": sorted(grads_a) == sorted(grads_b)})
parallel_state.destroy_model_parallel()

print_rows(result)
dist.destroy_process_group()
