"""Document-aware attention without an [s, s] mask: the layout's segments (what the varlen kernel
reads), the reference mask, context-parallel shards, and the attention core on CPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from infir.model.documents import build_layout, cp_positions, document_ids, gathered_order, reference_mask


def packed_positions(lengths: list[int]) -> torch.Tensor:
    """One row of positions restarting at each document."""
    return torch.cat([torch.arange(n) for n in lengths])


def per_document(q, k, v, lengths):
    """Causal attention of each document on its own, [1, h, s, d] tensors (the ground truth)."""
    out, at = [], 0
    for n in lengths:
        sl = slice(at, at + n)
        out.append(F.scaled_dot_product_attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], is_causal=True))
        at += n
    return torch.cat(out, dim=2)


def varlen_emulated(q, k, v, layout):
    """What FlashAttention's varlen kernel computes from the layout, segment by segment on CPU:
    q [Tq, h, d], k/v [Tk, h, d]; each query segment attends its key segment, bottom-right causal."""
    cu_q, cu_k = layout.cu_seqlens_q.tolist(), layout.cu_seqlens_kv.tolist()
    out = []
    for qa, qb, ka, kb in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:]):
        nq, nk = qb - qa, kb - ka
        assert nk >= nq > 0
        keep = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
        qs, ks, vs = (t.transpose(0, 1) for t in (q[qa:qb], k[ka:kb], v[ka:kb]))
        out.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=keep).transpose(0, 1))
    return torch.cat(out)


LENGTHS = [[64], [5, 17, 1, 30, 11], [40, 24], [3] * 21 + [1]]


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_cp_shards_match_megatrons_load_balancing(cp, monkeypatch):
    from types import SimpleNamespace

    from megatron.core.utils import get_batch_on_this_cp_rank

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # megatron reads the group's size only then
    seq = 48
    row = torch.arange(seq)[None]
    for rank in range(cp):
        group = SimpleNamespace(size=lambda: cp, rank=lambda: rank)
        theirs = get_batch_on_this_cp_rank({"tokens": row.clone()}, cp_group=group)["tokens"]
        assert theirs[0].tolist() == cp_positions(seq, cp, rank).tolist()
    every = np.sort(np.concatenate([cp_positions(seq, cp, r) for r in range(cp)]))
    assert every.tolist() == list(range(seq))
    gathered = np.concatenate([cp_positions(seq, cp, r) for r in range(cp)])
    assert (gathered[gathered_order(seq, cp)] == np.arange(seq)).all()


def test_plain_causal_rows_need_no_layout():
    assert build_layout(torch.arange(16).expand(3, 16)) is None
    assert build_layout(torch.arange(16).expand(1, 16), cp=2) is not None


@pytest.mark.parametrize("lengths", LENGTHS[1:])  # several documents a row: the first holds one
def test_reference_mask_keeps_documents_apart(lengths):
    layout = build_layout(packed_positions(lengths)[None])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, sum(lengths), 8, generator=g, dtype=torch.float64) for _ in range(3))
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=reference_mask(layout))
    torch.testing.assert_close(got, per_document(q, k, v, lengths))
    assert document_ids(packed_positions(lengths)[None])[0, -1] == len(lengths)


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_varlen_segments_equal_per_document_attention_on_every_cp_rank(lengths, cp):
    """The segments a rank hands the varlen kernel (key segments picked from the gathered keys by
    `key_index`) give, for its local queries, exactly each document's own causal attention."""
    seq, h, d = sum(lengths), 2, 8
    rows = torch.stack([packed_positions(lengths), packed_positions(lengths[::-1])])
    g = torch.Generator().manual_seed(cp)
    q, k, v = (torch.randn(2, h, seq, d, generator=g, dtype=torch.float64) for _ in range(3))
    truth = torch.stack([per_document(q[i:i + 1], k[i:i + 1], v[i:i + 1], ls)[0] for i, ls in enumerate([lengths, lengths[::-1]])])
    for rank in range(cp):
        layout = build_layout(rows, cp, rank)
        if layout is None:  # one document, no CP: the causal SDPA path
            continue
        local = torch.as_tensor(cp_positions(seq, cp, rank))
        flat = lambda t: t.permute(0, 2, 1, 3).reshape(-1, h, d)  # noqa: E731  [b, h, s, d] -> [b*s, h, d]
        q_local = flat(q[:, :, local])
        gathered = np.concatenate([cp_positions(seq, cp, r) for r in range(cp)])
        k_all, v_all = flat(k[:, :, gathered]), flat(v[:, :, gathered])
        if layout.key_index is not None:
            k_all, v_all = k_all[layout.key_index], v_all[layout.key_index]
        got = varlen_emulated(q_local, k_all, v_all, layout).reshape(2, len(local), h, d).permute(0, 2, 1, 3)
        torch.testing.assert_close(got, truth[:, :, local])
        # The reference mask of the same layout, over keys in sequence order, agrees.
        ref = F.scaled_dot_product_attention(q[:, :, local], k, v, attn_mask=reference_mask(layout))
        torch.testing.assert_close(ref, truth[:, :, local])


def test_context_parallelism_refuses_a_length_it_cannot_cut():
    with pytest.raises(ValueError, match="2 x parallel.cp"):
        cp_positions(30, 4, 0)


def core_attention(kernel="auto"):
    from infir.model.attention import CoreAttention
    from infir.model.qwen import get_size, transformer_config

    cfg = transformer_config(get_size("tiny"))
    return CoreAttention(cfg, layer_number=1, attn_mask_type=None, attention_type="self", kernel=kernel), cfg


def test_attention_core_on_packed_documents_matches_each_document_alone_with_gradients():
    attn, cfg = core_attention()
    lengths = [4, 3, 3, 6]
    s, heads, groups, d = sum(lengths), cfg.num_attention_heads, cfg.num_query_groups, cfg.kv_channels
    g = torch.Generator().manual_seed(1)
    q = torch.randn(s, 1, heads, d, generator=g, requires_grad=True)
    k, v = (torch.randn(s, 1, groups, d, generator=g, requires_grad=True) for _ in range(2))
    layout = build_layout(packed_positions(lengths)[None])
    packed = attn(q, k, v, None, packed_seq_params=layout)
    dy = torch.randn_like(packed)
    grads = torch.autograd.grad(packed, (q, k, v), dy)
    at = 0
    for n in lengths:
        sl = slice(at, at + n)
        qs, ks, vs = (t.detach()[sl].requires_grad_() for t in (q, k, v))
        alone = attn(qs, ks, vs, None)
        torch.testing.assert_close(packed[sl], alone)
        for full, part in zip(grads, torch.autograd.grad(alone, (qs, ks, vs), dy[sl])):
            torch.testing.assert_close(full[sl], part)
        at += n


def test_attention_kernels_are_checked():
    from infir.model.attention import resolve_kernel

    with pytest.raises(ValueError, match="valid: auto, varlen, flex, sdpa"):
        core_attention("flash3")
    assert resolve_kernel("auto", torch.device("cpu"), 32768) == "sdpa"
    cuda = torch.device("cuda")
    assert resolve_kernel("auto", cuda, 8192) == "varlen" and resolve_kernel("auto", cuda, 32768) == "flex"
    assert resolve_kernel("varlen", cuda, 32768) == "varlen"
    assert resolve_kernel("auto", cuda, 8192, torch.float32) == "flex"
    with pytest.raises(ValueError, match="bf16/fp16"):
        resolve_kernel("varlen", cuda, 8192, torch.float32)
    with pytest.raises(ValueError, match="CUDA only"):
        resolve_kernel("varlen", torch.device("cpu"))
    with pytest.raises(NotImplementedError, match="DocumentLayout"):
        attn, _ = core_attention()
        attn(*(torch.zeros(4, 1, 4, 32),) * 3, torch.zeros(1, 1, 4, 4, dtype=torch.bool))


def test_packed_row_loss_equals_each_document_run_alone(megatron_tp1):
    """Through the whole model (RoPE from the positions, restarting per document, and the attention
    core): a packed row's per-token losses are those of its documents run one by one from position 0."""
    from infir.model import build_gpt, get_size, transformer_config

    size = get_size("tiny")
    torch.manual_seed(0)
    model = build_gpt(size, transformer_config(size), seq_length=64).eval()
    lengths = [9, 20, 1, 14, 20]
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, size.vocab, (1, sum(lengths)), generator=g)
    labels = torch.randint(0, size.vocab, (1, sum(lengths)), generator=g)
    positions = packed_positions(lengths)[None]
    with torch.no_grad():
        packed = model(tokens, positions, None, labels=labels, packed_seq_params=build_layout(positions))
        at = 0
        for n in lengths:
            sl = slice(at, at + n)
            alone = model(tokens[:, sl], torch.arange(n)[None], None, labels=labels[:, sl])
            torch.testing.assert_close(packed[:, sl], alone, rtol=1e-5, atol=1e-5)
            at += n
        # RoPE reads the positions it is given (a shift changes no relative distance, a stretch does).
        stretched = model(tokens, positions * 2, None, labels=labels, packed_seq_params=build_layout(positions))
        assert (stretched - packed).abs().max() > 100 * 1e-5
