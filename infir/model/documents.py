"""Which keys each query attends, for packed documents and context parallelism, without an [s, s] mask.

A micro-batch row is a sequence of documents; its `position_ids` restart at 0 where a document starts
(packed SFT samples; CPT with `data.reset_attention_at_eod`, Megatron-LM's reset position ids), so
document boundaries are read off the positions and need no tensor of their own. A query attends the
keys of its own document at or before it.

Under context parallelism over N ranks the sequence is cut in 2N chunks and rank r holds chunks r and
2N-1-r (`cp_positions`, megatron's load balancing: every rank gets an early and a late chunk, so equal
causal work). Keys and values are all-gathered over the group, so a query chunk meets the whole
sequence before it.

Both cases reduce to one list of (query segment, key segment) pairs: each local query chunk cut at
document boundaries; a piece [p, q) of document d attends keys [start of d, q), bottom-right causal.
That is the variable-length form (cumulative lengths of query and key segments) that FlashAttention's
varlen kernel takes, and it is what `DocumentLayout` carries, next to the positions from which the
reference (a dense mask for SDPA) and FlexAttention's block mask are built.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from megatron.core.packed_seq_params import PackedSeqParams


def cp_positions(seq: int, cp: int, rank: int) -> np.ndarray:
    """Global positions of the tokens context-parallel rank `rank` holds, in its local order."""
    if cp == 1:
        return np.arange(seq)
    if seq % (2 * cp):
        raise ValueError(f"sequence length {seq} is not divisible by 2 x parallel.cp = {2 * cp}")
    c = seq // (2 * cp)
    return np.concatenate([np.arange(rank * c, (rank + 1) * c), np.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)])


def gathered_order(seq: int, cp: int) -> np.ndarray:
    """Where global position t sits in the concatenation of every rank's local tokens (rank order)."""
    where = np.empty(seq, dtype=np.int64)
    where[np.concatenate([cp_positions(seq, cp, r) for r in range(cp)])] = np.arange(seq)
    return where


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Per-token document index of each row [b, s]: a new document wherever the position is 0."""
    return (position_ids == 0).long().cumsum(-1)


@dataclass
class DocumentLayout(PackedSeqParams):
    """megatron's packed-sequence carrier (`qkv_format="sbhd"`: tensors keep their [s, b, ...] shape),
    plus what infir's attention needs: the full rows' `positions` [b, S] (the reference mask and Flex
    read them), the context-parallel size and rank, and under CP the `key_index` that picks every key
    segment out of the gathered keys (flattened [b x S], in gathered order)."""

    positions: torch.Tensor = None
    key_index: torch.Tensor = None
    cp: int = 1
    cp_rank: int = 0
    flex_mask: object = None  # FlexAttention's block mask, built by the first layer that needs it

    @property
    def local_positions(self) -> torch.Tensor:
        """Global positions of the local queries [s_local]."""
        return torch.as_tensor(cp_positions(self.positions.shape[1], self.cp, self.cp_rank), device=self.positions.device)

    def to(self, device) -> "DocumentLayout":
        moved = {k: getattr(self, k).to(device, non_blocking=True) for k in ("cu_seqlens_q", "cu_seqlens_kv", "positions", "key_index")
                 if getattr(self, k) is not None}
        return DocumentLayout(**{**self.__dict__, **moved})


def _pieces(starts: np.ndarray, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(query start, query end, key start) of the pieces of chunk [lo, hi): cut where a document starts;
    `starts[t]` is the first position of t's document."""
    cuts = [lo, *(t for t in np.flatnonzero(starts[lo:hi] == np.arange(lo, hi)) + lo if t > lo), hi]
    return [(a, b, int(starts[a])) for a, b in zip(cuts[:-1], cuts[1:])]


def build_layout(position_ids: torch.Tensor, cp: int = 1, cp_rank: int = 0) -> DocumentLayout | None:
    """The layout of a micro-batch from its full rows' `position_ids` [b, S] (on the host), for the
    tokens rank `cp_rank` of `cp` holds. None when there is nothing beyond causal attention: one
    document per row and no context parallelism."""
    pos = position_ids.cpu().numpy()
    b, seq = pos.shape
    if cp == 1 and not (pos[:, 1:] == 0).any():
        return None
    local = cp_positions(seq, cp, cp_rank)
    chunks = [(local[0], local[0] + len(local) // 2), (local[-1] + 1 - len(local) // 2, local[-1] + 1)] if cp > 1 else [(0, seq)]
    where = gathered_order(seq, cp) if cp > 1 else None
    q_lens, k_lens, k_index = [], [], []
    for row in range(b):
        starts = np.arange(seq) - pos[row]
        for lo, hi in chunks:
            for qa, qb, ka in _pieces(starts, lo, hi):
                q_lens.append(qb - qa)
                k_lens.append(qb - ka)
                if where is not None:  # without CP the key segments are the query segments themselves
                    k_index.append(row * seq + where[ka:qb])
    cu_q, cu_k = (torch.tensor(np.concatenate([[0], np.cumsum(n)]), dtype=torch.int32) for n in (q_lens, k_lens))
    return DocumentLayout(
        qkv_format="sbhd", cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k, max_seqlen_q=max(q_lens), max_seqlen_kv=max(k_lens),
        positions=position_ids, key_index=torch.from_numpy(np.concatenate(k_index)) if cp > 1 else None, cp=cp, cp_rank=cp_rank,
    )


def reference_mask(layout: DocumentLayout) -> torch.Tensor:
    """Boolean [b, 1, s_local, S], True where a local query may attend a key (keys in sequence order):
    same document and not after the query. SDPA's `attn_mask`: the reference every kernel is held to."""
    doc = document_ids(layout.positions)
    t = torch.arange(doc.shape[1], device=doc.device)
    q_t = layout.local_positions
    same = doc[:, q_t, None] == doc[:, None, :]
    return (same & (t[None, None, :] <= q_t[None, :, None]))[:, None]
