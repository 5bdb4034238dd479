"""The two FLOP counts: ours (causal attention counted as half the score square) and Megatron-LM's
(the whole square) agree on every matmul and differ only by that half."""
import pytest

from infir.model.qwen import SIZES
from infir.train.flops import flops_per_token, megatron_lm_flops_per_token


@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "qwen2.5-7b", "tiny"])
@pytest.mark.parametrize("seq", [4096, 32768])
def test_megatron_lm_count_adds_the_other_half_of_the_score_square(name, seq):
    size = SIZES[name]
    assert size.heads * size.head_dim == size.hidden  # where Megatron-LM's ratio terms reduce to ours
    extra = megatron_lm_flops_per_token(size, seq) - flops_per_token(size, seq)
    assert extra == pytest.approx(6.0 * size.layers * size.hidden * seq, rel=1e-9)
