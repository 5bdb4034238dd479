"""infir.eval.decode's sampling against transformers' own warpers: top-p keeps the tokens TopPLogitsWarper
keeps, and the draw picks each of them at its renormalized probability."""
import pytest
import torch

from infir.eval.decode import sample, top_p_probs


@pytest.mark.parametrize("temperature, top_p", [(0.65, 0.95), (1.0, 0.5), (0.3, 0.99), (1.0, 1.0)])
def test_the_nucleus_is_transformers_top_p(temperature, top_p):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(64, 1000) * 3
    warped = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(temperature)(None, logits.clone()))
    kept = top_p_probs(logits, temperature, top_p) > 0
    assert torch.equal(kept, warped > -float("inf"))
    want = torch.softmax(warped, dim=-1)
    got = top_p_probs(logits, temperature, top_p)
    torch.testing.assert_close(got / got.sum(-1, keepdim=True), want, rtol=1e-5, atol=1e-7)


def test_draws_follow_the_nucleus_probabilities_and_temperature_zero_is_argmax():
    torch.manual_seed(1)
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    assert torch.equal(sample(logits, 0.0, 0.9), torch.tensor([0]))
    p = top_p_probs(logits, 1.0, 0.9)[0]
    p = p / p.sum()
    draws = sample(logits.expand(200_000, -1), 1.0, 0.9)
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    assert freq[p == 0].sum() == 0  # nothing outside the nucleus
    torch.testing.assert_close(freq, p, atol=5e-3, rtol=0)
