"""infir.eval.gqa_decode: a decode step of a grouped-query model over left-padded rows gives eager attention's
logits without expanding K and V per query head (where transformers' SDPA path, under torch.compile, copies
them), prompts go through transformers' SDPA; the static decoder switches its model to it."""
import inspect

import torch

from infir.eval.gqa_decode import NAME, use_gqa_decode


def _model(attn: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, attn_implementation=attn, initializer_range=0.2)
    return Qwen2ForCausalLM(config).eval()


def _prompt_then_step(model):
    """Logits of the prompts (3 rows, left padding) and of one decode step after them."""
    gen = torch.Generator().manual_seed(1)
    ids, step = torch.randint(0, 256, (3, 10), generator=gen), torch.randint(0, 256, (3, 1), generator=gen)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, :4], mask[1, :1] = 0, 0
    # transformers renamed the forward's past_key_values to cache
    cache_arg = "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"
    with torch.no_grad():
        first = model(ids, attention_mask=mask, use_cache=True)
        nxt = model(step, attention_mask=torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1),
                    use_cache=True, **{cache_arg: first.past_key_values})
    return first.logits, nxt.logits


def test_decode_step_equals_eager_attention_without_copying_kv(monkeypatch):
    from transformers.integrations import sdpa_attention

    eager = _prompt_then_step(_model("eager"))
    model = _model("sdpa")
    use_gqa_decode(model)
    assert model.config._attn_implementation == NAME
    # as under torch.compile, where transformers' SDPA path would expand K and V for every decode step
    monkeypatch.setattr(sdpa_attention, "is_torchdynamo_compiling", lambda: True)
    copies = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda t, n: copies.append(t.shape) or real(t, n))
    prompts, step = _prompt_then_step(model)
    assert len(copies) == 2 * 2  # the prompts' forward: K and V of both layers, through transformers' SDPA
    for got, want in ((prompts, eager[0]), (step, eager[1])):
        assert torch.allclose(got[:, -1], want[:, -1], atol=1e-5, rtol=1e-5)


def test_sdpa_would_copy_kv_under_compile(monkeypatch):
    """What the above guards against: transformers' own SDPA path, as it runs inside a compiled decode step."""
    from transformers.integrations import sdpa_attention

    model = _model("sdpa")
    monkeypatch.setattr(sdpa_attention, "is_torchdynamo_compiling", lambda: True)
    copies = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda t, n: copies.append(t.shape) or real(t, n))
    _prompt_then_step(model)
    assert len(copies) == 2 * 2 * 2  # the prompts' forward and the decode step's


def test_compiled_decode_attention_equals_eager():
    """The packed form under torch.compile (as infir's decoder runs it), against eager attention's math."""
    from infir.eval.gqa_decode import gqa_decode_attention

    class Module(torch.nn.Module):
        num_key_value_groups = 4

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=gen) for s in ((3, 8, 1, 16), (3, 2, 12, 16), (3, 2, 12, 16)))
    mask = torch.arange(12).expand(3, 1, 1, 12) >= torch.tensor([0, 3, 7]).view(3, 1, 1, 1)  # left padding
    got, _ = torch.compile(gqa_decode_attention, fullgraph=True)(Module(), q, k, v, mask, scaling=0.25)
    scores = (q @ k.repeat_interleave(4, 1).transpose(-1, -2)) * 0.25
    want = (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v.repeat_interleave(4, 1)).transpose(1, 2)
    assert got.shape == (3, 1, 8, 16) and torch.allclose(got, want, atol=1e-5)


def test_the_static_decoder_switches_its_model(lively_model_dir):
    from transformers import AutoTokenizer

    from infir.eval.backends import HFBackend

    backend = HFBackend(lively_model_dir, AutoTokenizer.from_pretrained(lively_model_dir), device="cpu",
                        cache="static", compile=False)
    assert backend.model.config._attn_implementation == NAME
    dynamic = HFBackend(lively_model_dir, AutoTokenizer.from_pretrained(lively_model_dir), device="cpu", cache="dynamic")
    assert dynamic.model.config._attn_implementation == "sdpa"


def test_other_attention_is_left_alone():
    model = _model("eager")
    use_gqa_decode(model)
    assert model.config._attn_implementation == "eager"
