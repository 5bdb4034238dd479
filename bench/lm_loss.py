"""LM head + cross entropy, forward + backward: megatron's path (as our trainer runs it) vs infir's chunked,
fused one (infir.model.lm_loss). GPU only.

megatron: ColumnLinear LM head (full [s, b, V] bf16 logits under autocast) + megatron's fused "native"
vocab-parallel CE (config cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native"), then the
trainer's (per_token.float() * loss_mask).sum(). ours: chunked_lm_loss with the Triton per-chunk kernels,
and with the PyTorch per-chunk ops (to show what Triton buys). FP32 weight (the trainer's params) under
bf16 autocast, bf16 hidden states. Peak = max allocated during one fwd+bwd minus what was allocated before.

    python bench/lm_loss.py [--out PATH] [--tokens 8192 16384] [--chunk 8192 4096]
    python bench/lm_loss.py --step qwen2.5-1.5b   # also: the whole GPTModel fwd+bwd, chunked loss off vs on
"""
from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import base_parser, bench_ms, emit, markdown_table  # noqa: E402

SHAPES = {"qwen2.5-1.5b": (1536, 151936), "qwen2.5-7b": (3584, 152064)}
MICRO_BATCH = 2


def setup_megatron():
    from megatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    return parallel_state.get_tensor_model_parallel_group()


def megatron_head(hidden_size: int, vocab: int):
    from megatron.core.transformer.transformer_config import TransformerConfig

    from infir.model.linears import ColumnLinear

    cfg = TransformerConfig(
        num_layers=1, hidden_size=hidden_size, num_attention_heads=8, params_dtype=torch.float32,
        cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native", use_cpu_initialization=False,
        gradient_accumulation_fusion=False,
    )
    head = ColumnLinear(
        hidden_size, vocab, config=cfg, init_method=lambda w: torch.nn.init.normal_(w, std=0.02),
        bias=False, gather_output=False, skip_bias_add=False,
    ).cuda()
    return head


def megatron_loss(head, tp_group, hidden, labels, mask):
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy

    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, _ = head(hidden)
    per_token = fused_vocab_parallel_cross_entropy(logits, labels.t().contiguous(), tp_group).t()
    return (per_token.float() * mask).sum()


def ours_loss(weight, hidden, labels, mask, chunk: int, use_triton: bool):
    from infir.model.lm_loss import chunked_lm_loss

    with torch.autocast("cuda", dtype=torch.bfloat16):
        return chunked_lm_loss(hidden, weight, labels, mask, chunk_tokens=chunk, use_triton=use_triton).loss


def measure(step, params, keep=lambda ps: [p.grad.clone() for p in ps], rep_ms: int = 300):
    """(median ms of fwd+bwd, peak extra GiB, loss, keep(params) after one step) of a closure returning the loss."""

    def run():
        for p in params:
            p.grad = None
        loss = step()
        loss.backward()
        return loss

    loss = run()  # compile / autotune outside the timing
    grads = keep(params)
    for p in params:
        p.grad = None
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    ms = bench_ms(run, warmup=50, rep=rep_ms)
    return ms, peak, loss.detach(), grads


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def model_step(name: str, seq: int, chunk: int) -> list[dict]:
    """Whole-model fwd+bwd (no optimizer, no per-layer compile) with megatron's loss path vs the chunked one."""
    from infir.model.qwen import build_gpt, get_size, transformer_config

    size = get_size(name)
    cfg = transformer_config(size, params_dtype=torch.float32, cpu_init=False, fusions=True)
    model = build_gpt(size, cfg, seq_length=seq).cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    tokens = torch.randint(0, size.vocab, (MICRO_BATCH, seq + 1), device="cuda", generator=g)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    mask = (torch.rand(MICRO_BATCH, seq, device="cuda", generator=g) > 0.1).float()
    positions = torch.arange(seq, device="cuda").expand(MICRO_BATCH, seq)
    params = [p for p in model.parameters() if p.requires_grad]

    def step(chunked: bool):
        model.chunked_loss, model.loss_chunk_tokens = chunked, chunk
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(inputs, positions, None, labels=labels, loss_mask=mask)
        return out if chunked else (out.float() * mask).sum()

    rows, ref = [], None
    for chunked in (False, True):
        grad_norm = lambda ps: torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in ps])).item()
        ms, peak, loss, gnorm = measure(lambda: step(chunked), params, keep=grad_norm, rep_ms=3000)
        if ref is None:
            ref = (ms, loss, gnorm)
        rows.append({"model": name, "tokens": MICRO_BATCH * seq, "loss path": f"chunked {chunk} (triton)" if chunked else "megatron",
                     "fwd+bwd ms": ms, "peak extra GiB": peak, "speedup": ref[0] / ms,
                     "loss rel err": abs((loss - ref[1]) / ref[1]).item(), "grad-norm rel err": abs(gnorm - ref[2]) / ref[2]})
        print(rows[-1], flush=True)
        gc.collect()
    del model, params
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--chunk", type=int, nargs="+", default=[8192, 4096])
    p.add_argument("--models", nargs="+", default=list(SHAPES))
    p.add_argument("--step", nargs="*", default=[], help="model sizes for the whole-model fwd+bwd comparison")
    p.add_argument("--step-seq", type=int, default=4096)
    p.add_argument("--no-head", action="store_true", help="skip the LM-head-only table")
    args = p.parse_args()
    tp_group = setup_megatron()
    step_rows = []
    for name in args.step:
        step_rows += model_step(name, args.step_seq, args.chunk[0])
    rows = []
    if args.no_head:
        args.models = []
    for name in args.models:
        h, vocab = SHAPES[name]
        head = megatron_head(h, vocab)
        weight = head.weight
        for tokens in args.tokens:
            s = tokens // MICRO_BATCH
            g = torch.Generator(device="cuda").manual_seed(tokens)
            hidden = torch.randn(s, MICRO_BATCH, h, device="cuda", generator=g).bfloat16().requires_grad_()
            labels = torch.randint(0, vocab, (MICRO_BATCH, s), device="cuda", generator=g)
            mask = (torch.rand(MICRO_BATCH, s, device="cuda", generator=g) > 0.1).float()
            params = [hidden, weight]
            ref_ms, ref_peak, ref_loss, (ref_dh, ref_dw) = measure(lambda: megatron_loss(head, tp_group, hidden, labels, mask), params)
            rows.append({"model": name, "tokens": tokens, "path": "megatron (ColumnLinear + fused native CE)", "fwd+bwd ms": ref_ms,
                         "peak extra GiB": ref_peak, "speedup": 1.0, "loss rel err": 0.0, "dH rel err": 0.0, "dW rel err": 0.0})
            variants = [(c, True) for c in args.chunk] + [(args.chunk[0], False)]
            for chunk, use_triton in variants:
                ms, peak, loss, (dh, dw) = measure(lambda: ours_loss(weight, hidden, labels, mask, chunk, use_triton), params)
                rows.append({"model": name, "tokens": tokens, "path": f"chunked {chunk} ({'triton' if use_triton else 'torch ops'})",
                             "fwd+bwd ms": ms, "peak extra GiB": peak, "speedup": ref_ms / ms,
                             "loss rel err": abs((loss - ref_loss) / ref_loss).item(), "dH rel err": rel(dh, ref_dh), "dW rel err": rel(dw, ref_dw)})
                print(rows[-1], flush=True)
            del hidden, labels, mask, ref_dh, ref_dw
            gc.collect()
            torch.cuda.empty_cache()
        del head, weight
        gc.collect()
        torch.cuda.empty_cache()
    notes = (f"micro-batch {MICRO_BATCH}, hidden [s, b, h] bf16, LM-head weight FP32 param under bf16 autocast, 10% of tokens masked. "
             "Errors are max|ours - megatron| / max|megatron| over the same inputs.")
    sections = [notes, markdown_table(rows)] if rows else []
    if step_rows:
        sections += [f"Whole GPTModel fwd+bwd (fp32 params, bf16 autocast, megatron fusions on, no per-layer compile, no optimizer), "
                     f"micro-batch {MICRO_BATCH} x seq {args.step_seq}; peak extra = activations + grads over the weights:",
                     markdown_table(step_rows)]
    emit("LM head + cross entropy, fwd+bwd", sections, args.out)


if __name__ == "__main__":
    main()
