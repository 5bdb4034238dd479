"""bench/attention.py's accounting on CPU: the packed documents, the mask and the work it keeps."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import attention  # noqa: E402

from infir.train.synthetic import document_lengths  # noqa: E402


def test_documents_pack_to_the_sequence_and_the_mask_keeps_their_causal_pairs():
    for seq, median in ((4096, 512), (8192, 1536), (1000, 2000)):
        lengths = document_lengths(seq, median)
        assert sum(lengths) == seq and min(lengths) >= 1
        assert document_lengths(seq, median) == lengths  # seeded
        if seq <= 4096:
            mask = attention.dense_document_mask(lengths, "cpu")
            assert int(mask.sum()) == attention.attended_pairs(lengths)
            assert bool(mask.diagonal().all()) and not bool(mask.triu(1).any())
    assert attention.attended_pairs([4]) == 10


def test_dense_mask_attention_equals_per_document_causal_attention():
    lengths = [5, 3, 8]
    q, k, v = (torch.randn(1, h, 16, 8) for h in (4, 2, 2))
    got = attention.sdpa(q, k, v, mask=attention.dense_document_mask(lengths, "cpu"))
    starts = [0, 5, 8, 16]
    want = torch.cat([attention.sdpa(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], causal=True)
                      for a, b in zip(starts, starts[1:])], dim=2)
    torch.testing.assert_close(got, want)


def test_tflops_counts_fwd_and_bwd_of_the_kept_pairs():
    # 1e12 pairs x 4 flops x d=128 x 1 head x 3.5 in one second
    assert abs(attention.attention_tflops(10**12, 1, 1000.0) - 3.5 * 4 * 128) < 1e-6
