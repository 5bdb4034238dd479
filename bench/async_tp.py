#!/usr/bin/env python3
"""Can a sequence-parallel linear's collective hide behind its GEMM? The NCCL collective, then the GEMM
(infir's default), against torch's symmetric-memory async TP, which moves each rank's shard over NVLink with
the copy engines (no SMs taken from the GEMM) and computes on the shards as they arrive, and against infir's
split schedules (parallel.tp_comm_overlap: infir.fp8.sp_overlap, per-rank GEMMs around the other ranks' rows
pulled, or partials pushed, by copy engine over symmetric memory, through the same graph ops the trainer
runs); per GEMM of a layer.

    torchrun --nproc-per-node 2 bench/async_tp.py --model qwen2.5-7b --tokens 8192 --out async_tp.md

Column-parallel GEMMs (QKV, FC1): all-gather of the input's token shard, then X @ W^T. BF16 through
torch.ops.symm_mem.fused_all_gather_matmul; FP8 (1x128 activations, 128x128 weights, scaled_mm) through
symm_mem's pipelined all-gather-and-consume with infir's blockwise GEMM on each arriving shard, because
torch's FP8 op takes tensor- or row-wise scales only. Row-parallel GEMMs (proj, FC2): X @ W^T, then the
reduce-scatter over tokens; BF16 through fused_matmul_reduce_scatter, FP8 through the pipelined
produce-and-all-to-all. The FP8 pipelined paths copy each shard's product once into the output (the BF16 ops
write it in place). Times: CUDA events around back-to-back calls, the slowest rank's mean. `hidden`: the
share of the shorter of collective and GEMM that a form saves against running them one after the other
(1: fully hidden; below 0: slower than not overlapping at all), for the fused (symmetric-memory) and the
split (infir) forms.

The split form also replays from a CUDA graph, as the trainer's compiled FP8 layers run it (`split graphed`),
without the host time of its eager calls. `split graphed, carveout` captures the GEMMs with --sm-carveout SMs
left to other kernels (torch's cuBLASLt SM count target), which an exchange's NCCL kernel would otherwise take
from a persistent cuBLAS GEMM (bench/side_stream.py). `fused graphed` replays the symmetric-memory form from a
graph: its copy-engine transfers without the host time of its many small eager calls. `split graphed, exchanges`
moves the split schedules' rows and partials by NCCL exchanges instead of the copy engines.
"""
from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import base_parser, capture_graph, emit, markdown_table, slowest_rank_ms  # noqa: E402


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))


def fp8_operands(x: torch.Tensor, w: torch.Tensor):
    """x quantized per 1x128 (scales row-major, so that token shards concatenate along dim 0) and w per
    128x128 block with its scale in scaled_mm's layout, made once as the weight cache does."""
    from infir.fp8 import quantize
    from infir.fp8.gemm import scaled_mm_scale

    qx, qw = quantize(x, "token", "ue8m0"), quantize(w, "block", "ue8m0")
    return qx.data, qx.scale.contiguous(), qw.data, scaled_mm_scale(qw)


def fp8_mm(data: torch.Tensor, scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    from infir.fp8.gemm import outer_dim_major, scaled_mm_blockwise

    return scaled_mm_blockwise(data, outer_dim_major(scale), w, w_scale, "block", torch.bfloat16)


def column_cases(tokens: int, k: int, n: int, group):
    """(precision, gemm, collective, sequential, fused) callables of a column-parallel GEMM, and each form's
    output for the agreement check."""
    from torch.distributed._symmetric_memory import _pipelined_multi_all_gather_and_consume

    import infir.model.linears  # noqa: F401  (registers the BF16 split schedules' graph ops)
    from infir.fp8 import quantize
    from infir.fp8.gemm import outer_dim_major
    from infir.fp8.ops import fp8_gather_mm

    world, name = group.size(), group.group_name
    x = torch.randn(tokens // world, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    full = torch.empty(tokens, k, device="cuda", dtype=torch.bfloat16)
    gather = lambda: dist.all_gather_into_tensor(full, x, group=group)  # noqa: E731
    bf16 = ("bf16", lambda: full @ w.t(), gather, lambda: (gather(), full @ w.t())[1],
            lambda: torch.ops.symm_mem.fused_all_gather_matmul(x, [w.t()], 0, name)[1][0],
            lambda: torch.ops.infir.sp_gather_linear(x, w, False, False, name, world)[0])
    data, scale, wq, ws = fp8_operands(x, w)
    w_block = quantize(w, "block", "ue8m0").scale
    data_full = data.new_empty(tokens, k)
    scale_full = scale.new_empty(tokens, scale.shape[1])
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    chunks = out.chunk(world)

    def gather8():
        dist.all_gather_into_tensor(data_full, data, group=group)
        dist.all_gather_into_tensor(scale_full, scale, group=group)

    def consume(shard, src):
        chunks[src].copy_(fp8_mm(shard[0], shard[1], wq, ws))

    def fused8():
        _pipelined_multi_all_gather_and_consume([data, scale], consume, [data_full, scale_full], name)
        return out

    def split8():
        return fp8_gather_mm(data, outer_dim_major(scale), "token", wq, w_block, "block", torch.bfloat16, False, ws,
                             name, world, [], [])[0]

    fp8 = ("fp8", lambda: fp8_mm(data_full, scale_full, wq, ws), gather8,
           lambda: (gather8(), fp8_mm(data_full, scale_full, wq, ws))[1], fused8, split8)
    return [bf16, fp8]


def row_cases(tokens: int, k: int, n: int, group):
    """As column_cases, for a row-parallel GEMM and the reduce-scatter of its product over tokens."""
    from torch.distributed._symmetric_memory import _pipelined_produce_and_all2all

    import infir.model.linears  # noqa: F401  (registers the BF16 split schedules' graph ops)
    from infir.fp8 import quantize
    from infir.fp8.gemm import outer_dim_major
    from infir.fp8.ops import fp8_mm_reduce_scatter

    world, name = group.size(), group.group_name
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    y = x @ w.t()
    mine = torch.empty(tokens // world, n, device="cuda", dtype=torch.bfloat16)
    scatter = lambda: dist.reduce_scatter_tensor(mine, y, group=group)  # noqa: E731
    bf16 = ("bf16", lambda: x @ w.t(), scatter, lambda: (dist.reduce_scatter_tensor(mine, x @ w.t(), group=group), mine)[1],
            lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(x, w.t(), "sum", 0, name),
            lambda: torch.ops.infir.sp_linear_reduce_scatter(x, w, name, world))
    # each destination rank's tokens quantized on their own: per-token scales, so the same bytes as the whole
    parts = [fp8_operands(c, w) for c in x.chunk(world)]
    wq, ws = parts[0][2], parts[0][3]
    data = torch.cat([p[0] for p in parts])
    scale = torch.cat([p[1] for p in parts])
    partials = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)

    def produce(dst, out):
        out.copy_(fp8_mm(parts[dst][0], parts[dst][1], wq, ws))

    def fused8():
        _pipelined_produce_and_all2all(produce, partials, name)
        return partials.view(world, tokens // world, n).sum(0)

    w_block = quantize(w, "block", "ue8m0").scale

    def split8():
        return fp8_mm_reduce_scatter(data, outer_dim_major(scale), "token", wq, w_block, "block", torch.bfloat16, False,
                                     ws, name, world)

    fp8 = ("fp8", lambda: fp8_mm(data, scale, wq, ws), lambda: dist.reduce_scatter_tensor(mine, y, group=group),
           lambda: (dist.reduce_scatter_tensor(mine, fp8_mm(data, scale, wq, ws), group=group), mine)[1], fused8, split8)
    return [bf16, fp8]


def graphed(fn, carveout: int | None):
    """fn's replay from a CUDA graph whose GEMMs leave `carveout` SMs (None: none), and the output it writes."""
    graph, out = capture_graph(fn, sm_carveout=carveout)
    return graph.replay, out


@contextlib.contextmanager
def exchanges_only():
    """infir's split schedules over NCCL exchanges even between GPUs of one host, as they moved before the copy
    engines took them: the same-run baseline of that change (captured so, a graph replays it so)."""
    from infir.fp8 import sp_overlap

    real = sp_overlap.shares_memory
    sp_overlap.shares_memory = lambda group: False
    try:
        yield
    finally:
        sp_overlap.shares_memory = real


def measure(gemm: str, side, tokens: int, k: int, n: int, group, warmup: int, iters: int,
            carveout: int) -> list[dict]:
    rows = []
    for precision, mm, comm, seq, fused, split in side(tokens, k, n, group):
        forms = [("gemm", mm), ("collective", comm), ("sequential", seq), ("fused", fused), ("split", split)]
        try:
            (replay, replayed), (carved, carved_out) = graphed(split, None), graphed(split, carveout)
            forms += [("split graphed", replay), ("split graphed, carveout", carved)]
        except RuntimeError as e:  # the eager forms' figures stand without the graphed ones
            print(f"{gemm} {precision}: the split form was not captured in a CUDA graph: {e}", flush=True)
        with exchanges_only():
            exchanged, exchanged_out = graphed(split, None)
        forms.append(("split graphed, exchanges", exchanged))
        try:  # the copy engines' transfers without the host's launch time
            fused_replay, fused_replayed = graphed(fused, None)
            forms.append(("fused graphed", fused_replay))
        except Exception as e:  # symmetric memory's calls may refuse capture: the other forms stand  # noqa: BLE001
            print(f"{gemm} {precision}: the fused form was not captured in a CUDA graph: {e}", flush=True)
        t = {key: slowest_rank_ms(fn, group, warmup, iters) for key, fn in forms}
        shorter = min(t["gemm"], t["collective"])
        rows.append({"GEMM": gemm, "precision": precision, "tokens x K x N": f"{tokens}x{k}x{n}",
                     "gemm ms": t["gemm"], "collective ms": t["collective"], "sequential ms": t["sequential"],
                     "fused ms": t["fused"], "fused hidden": (t["sequential"] - t["fused"]) / shorter,
                     "split ms": t["split"], "split hidden": (t["sequential"] - t["split"]) / shorter,
                     "split speedup": t["sequential"] / t["split"],
                     **({"split graphed ms": t["split graphed"],
                         "split graphed hidden": (t["sequential"] - t["split graphed"]) / shorter,
                         "split graphed, carveout ms": t["split graphed, carveout"],
                         "split graphed, carveout hidden": (t["sequential"] - t["split graphed, carveout"]) / shorter,
                         "graphed vs sequential (rel.)": max(rel_diff(replayed, seq()), rel_diff(carved_out, seq()))}
                        if "split graphed" in t else {}),
                     **({"split graphed, exchanges ms": t["split graphed, exchanges"],
                         "exchanges vs sequential (rel.)": rel_diff(exchanged_out, seq())}
                        if "split graphed, exchanges" in t else {}),
                     **({"fused graphed ms": t["fused graphed"],
                         "fused graphed hidden": (t["sequential"] - t["fused graphed"]) / shorter,
                         "fused graphed vs sequential (rel.)": rel_diff(fused_replayed, seq())}
                        if "fused graphed" in t else {}),
                     "fused vs sequential (rel.)": rel_diff(fused(), seq()),
                     "split vs sequential (rel.)": rel_diff(split(), seq())})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-7b")
    p.add_argument("--tokens", type=int, default=4096, help="tokens of one micro-batch (all TP ranks together)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sm-carveout", type=int, default=16,
                   help="SMs the graphed split form's GEMMs leave to the exchange's NCCL kernel")
    args = p.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or not torch.cuda.is_available():
        sys.exit("async_tp.py: needs two or more GPUs under torchrun: "
                 "torchrun --nproc-per-node 2 bench/async_tp.py --out FILE.md")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    group = dist.group.WORLD
    from infir.model.qwen import get_size

    size, tp = get_size(args.model), group.size()
    d, kv, f = size.hidden, size.kv_heads * size.head_dim, size.ffn
    shapes = [("QKV", column_cases, d, (d + 2 * kv) // tp), ("FC1", column_cases, d, 2 * f // tp),
              ("proj", row_cases, d // tp, d), ("FC2", row_cases, f // tp, d)]
    torch.manual_seed(dist.get_rank())
    rows = [r for gemm, side, k, n in shapes
            for r in measure(gemm, side, args.tokens, k, n, group, args.warmup, args.iters, args.sm_carveout)]
    if dist.get_rank() == 0:
        emit("Sequence-parallel collective beside its GEMM: NCCL then GEMM vs symmetric-memory async TP vs infir's "
             "split schedules (bench/async_tp.py)",
             [f"{args.model}, TP={tp} (one GPU per rank), {args.tokens} tokens a micro-batch; NVLink multicast off "
              f"(TORCH_SYMM_MEM_DISABLE_MULTICAST={os.environ.get('TORCH_SYMM_MEM_DISABLE_MULTICAST', 'unset')}); "
              f"carveout: {args.sm_carveout} SMs",
              markdown_table(rows)], args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
