"""Attention kernels at the recipe's shapes, forward + backward of one layer: which one a causal and a
packed-documents micro-batch should run. GPU only (the kernels are CUDA's).

Cases, at Qwen2.5-1.5B's and 7B's heads (12/2 and 28/4 query/KV heads, head dim 128), bf16:
- causal: SDPA with each backend forced (cuDNN, flash, memory-efficient) and FlexAttention's causal block mask;
- documents (a sequence packed from documents of seeded log-normal lengths, causal within each): SDPA with the
  dense [s, s] boolean mask (what packed SFT handed it), FlexAttention with a document block mask, and
  `torch.nn.attention.varlen.varlen_attn` (FlashAttention varlen) over the documents' cumulative lengths;
  and infir's CoreAttention on the same documents (what the trainer runs: its varlen and flex kernels).
Each kernel's output and input gradients are checked against the dense-mask SDPA reference first (bf16
tolerance); TFLOP/s counts only the unmasked work (causal: half of each document's square).

    python bench/attention.py [--seq 8192 32768] [--models qwen2.5-1.5b qwen2.5-7b] [--doc-median 1536] [--out PATH]
"""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import base_parser, bench_ms, emit, markdown_table  # noqa: E402

from infir.train.synthetic import document_lengths  # noqa: E402

HEADS = {"qwen2.5-1.5b": (12, 2), "qwen2.5-7b": (28, 4)}
HEAD_DIM = 128
SDPA_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")


def attended_pairs(lengths: list[int]) -> int:
    """Query-key pairs a causal mask within each document keeps."""
    return sum(n * (n + 1) // 2 for n in lengths)


def attention_tflops(pairs: int, q_heads: int, ms: float) -> float:
    """Forward 4 flops per pair and head dim (QK^T, PV), backward 2.5x that."""
    return 3.5 * 4 * pairs * HEAD_DIM * q_heads / (ms * 1e-3) / 1e12


def dense_document_mask(lengths: list[int], device) -> torch.Tensor:
    """The [s, s] boolean mask: causal within each document, nothing across."""
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    pos = torch.arange(doc.numel(), device=device)
    return (doc[:, None] == doc[None, :]) & (pos[:, None] >= pos[None, :])


def sdpa(q, k, v, mask=None, causal=False):
    """q [1, Hq, s, d], k/v [1, Hkv, s, d]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)


def flex_case(q, k, v, lengths, causal_only: bool):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    s = q.shape[2]
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=q.device), torch.tensor(lengths, device=q.device))

    def mask_mod(b, h, qi, ki):
        return (qi >= ki) if causal_only else ((qi >= ki) & (doc[qi] == doc[ki]))

    block = create_block_mask(mask_mod, None, None, s, s, device=q.device)
    flex = torch.compile(flex_attention)
    return lambda: flex(q, k, v, block_mask=block, enable_gqa=True)


def varlen_case(q, k, v, lengths):
    """FlashAttention varlen over [total, H, d] tensors; causal as this torch's signature names it."""
    from torch.nn.attention.varlen import varlen_attn

    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=q.device)
    qt, kt, vt = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))  # [s, H, d], gradients reach the leaves
    params = inspect.signature(varlen_attn).parameters
    kw = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "enable_gqa" in params:
        kw["enable_gqa"] = True
    else:  # repeat the KV heads for a torch without GQA in varlen
        rep = q.shape[1] // k.shape[1]
        kt, vt = kt.repeat_interleave(rep, 1), vt.repeat_interleave(rep, 1)
    m = max(lengths)
    return lambda: varlen_attn(qt, kt, vt, cu, cu, m, m, **kw).transpose(0, 1).unsqueeze(0)


def infir_case(q, k, v, lengths, kernel: str):
    """infir's CoreAttention as the trainer runs it: [s, b, h, d] in, a DocumentLayout from the
    positions (what its wrappers around the kernel cost shows against the bare kernel's row)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from infir.model.attention import CoreAttention
    from infir.model.documents import build_layout

    hq, hkv = q.shape[1], k.shape[1]
    cfg = TransformerConfig(num_layers=1, hidden_size=hq * HEAD_DIM, num_attention_heads=hq, num_query_groups=hkv,
                            kv_channels=HEAD_DIM, attention_dropout=0.0)
    attn = CoreAttention(cfg, layer_number=1, attn_mask_type=None, attention_type="self", kernel=kernel)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    layout = build_layout(positions).to(q.device)
    s = q.shape[2]

    def run():
        out = attn(*(t.permute(2, 0, 1, 3) for t in (q, k, v)), None, packed_seq_params=layout)
        return out.view(s, 1, hq, HEAD_DIM).permute(1, 2, 0, 3)
    return run


def fwd_bwd(fn, q, k, v, dy):
    def run():
        for t in (q, k, v):
            t.grad = None
        fn().backward(dy)
    return run


def outputs(fn, q, k, v, dy):
    fwd_bwd(fn, q, k, v, dy)()
    return [t.detach().float() for t in (fn(), q.grad, k.grad, v.grad)]


def cases(q, k, v, lengths) -> list[tuple[str, str, object]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def forced(name):
        backend = getattr(SDPBackend, name)

        def run():
            with sdpa_kernel(backend):
                return sdpa(q, k, v, causal=True)
        return run

    mask = dense_document_mask(lengths, q.device)
    out = [("causal", f"sdpa {b.split('_')[0].lower()}", forced(b)) for b in SDPA_BACKENDS]
    out.append(("causal", "flex block mask", flex_case(q, k, v, lengths, causal_only=True)))
    out.append(("documents", "sdpa dense mask", lambda: sdpa(q, k, v, mask=mask)))
    out.append(("documents", "flex document mask", flex_case(q, k, v, lengths, causal_only=False)))
    out.append(("documents", "varlen (flash)", varlen_case(q, k, v, lengths)))
    for kernel in ("varlen", "flex"):
        out.append(("documents", f"infir CoreAttention ({kernel})", infir_case(q, k, v, lengths, kernel)))
    return out


def measure(model: str, seq: int, median: int) -> list[dict]:
    hq, hkv = HEADS[model]
    g = torch.Generator(device="cuda").manual_seed(seq)
    q, k, v = (torch.randn(1, h, seq, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
               for h in (hq, hkv, hkv))
    dy = torch.randn(1, hq, seq, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16)
    lengths = document_lengths(seq, median)
    refs = {"causal": outputs(lambda: sdpa(q, k, v, causal=True), q, k, v, dy)}
    rows = []
    for mask_kind, kernel, fn in cases(q, k, v, lengths):
        row = {"model": model, "seq": seq, "mask": mask_kind, "kernel": kernel,
               "docs": len(lengths) if mask_kind == "documents" else 1}
        try:
            got = outputs(fn, q, k, v, dy)
            if mask_kind == "documents" and "documents" not in refs:
                refs["documents"] = got  # the dense-mask SDPA, listed first: the reference of the others
            err = max(float((a - b).norm() / b.norm()) for a, b in zip(got, refs[mask_kind]))
            ms = bench_ms(fwd_bwd(fn, q, k, v, dy))
            pairs = attended_pairs(lengths) if mask_kind == "documents" else attended_pairs([seq])
            row.update({"fwd+bwd ms": ms, "TFLOP/s": attention_tflops(pairs, hq, ms), "max rel err": err})
        except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is a row, not a crash
            row["fwd+bwd ms"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--models", nargs="+", default=list(HEADS))
    p.add_argument("--doc-median", type=int, default=1536, help="median document length of the packed case")
    args = p.parse_args()
    rows = [r for m in args.models for s in args.seq for r in measure(m, s, args.doc_median)]
    cols = ["model", "seq", "mask", "kernel", "docs", "fwd+bwd ms", "TFLOP/s", "max rel err"]
    emit("Attention kernels, one layer fwd+bwd (bench/attention.py)",
         [f"bf16, head dim {HEAD_DIM}, batch 1; documents: log-normal lengths, median {args.doc_median}, causal within "
          "each; TFLOP/s over the unmasked pairs only; max rel err: of out, dQ, dK, dV against SDPA (causal: its "
          "default backend; documents: the dense mask)", markdown_table(rows, cols)], args.out)


if __name__ == "__main__":
    main()
