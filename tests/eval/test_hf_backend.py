"""HFBackend's batching: sequences generated in prompt-length order come back in the prompts' order with
the tokens of unsorted batches; the static KV cache gives the dynamic cache's greedy tokens; the cache
and compile options are checked before a model loads. A tiny random Qwen2 on CPU (the gpu test: CUDA)."""
import pytest
import torch

from infir.eval.backends import HFBackend, sequence_order
from infir.eval.benchmarks import Sampling
from infir.eval.cli import main
from infir.eval.config import load_config

# Chat-templated prompts of distinct lengths, given out of length order.
PROMPTS = [f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n" for text in (
    "What is 12 times 7, and why?", "Hi", "Add 3 and 4.", "List the first five primes, then sum them up please.",
    "2+2?")]
GREEDY = Sampling(n=2, temperature=0.0, max_new_tokens=6)


def backend(model_dir, **options) -> HFBackend:
    from transformers import AutoTokenizer

    # batch 3 over 5 prompts x 2 samples: calls mix prompts and split one prompt's samples
    return HFBackend(model_dir, AutoTokenizer.from_pretrained(model_dir), device="cpu", batch_size=3, **options)


def test_sequence_order_sorts_prompts_and_keeps_samples_together():
    assert sequence_order([5, 1, 3], 2, by_length=True) == [2, 3, 4, 5, 0, 1]
    assert sequence_order([5, 1, 3], 2, by_length=False) == [0, 1, 2, 3, 4, 5]


def test_sorted_batches_return_the_prompts_order_and_unsorted_tokens(lively_model_dir):
    lengths = [len(ids) for ids in backend(lively_model_dir).tokenizer(PROMPTS, add_special_tokens=False)["input_ids"]]
    assert sorted(lengths) != lengths  # the sorted run does reorder the sequences
    by_length = backend(lively_model_dir).generate(PROMPTS, GREEDY, seed=0)
    as_given = backend(lively_model_dir, sort_by_length=False).generate(PROMPTS, GREEDY, seed=0)
    assert by_length == as_given
    assert [len(c) for c in by_length] == [GREEDY.n] * len(PROMPTS)
    assert all(a == b for a, b in by_length)  # greedy: a prompt's samples agree
    assert len({c[0].text for c in by_length}) > 1  # the prompts' answers differ: a mix-up would show
    one_by_one = [backend(lively_model_dir).generate([p], GREEDY, seed=0)[0] for p in PROMPTS]
    assert by_length == one_by_one  # no padding at all


def test_static_cache_gives_the_dynamic_cache_greedy_tokens(lively_model_dir):
    """The static cache runs infir's decoder (decode.py), not transformers' generate, and stops where
    generate does: its greedy tokens, stop tokens and finish reasons are the dynamic cache's."""
    dynamic, static = backend(lively_model_dir, cache="dynamic"), backend(lively_model_dir, cache="static", compile=False)
    assert (dynamic.cache, static.cache, static.compile) == ("dynamic", "static", False)
    first = dynamic.generate(PROMPTS, GREEDY, seed=0)
    # a stop id the model reaches: one prompt stops early, the others run out of tokens
    stop = dynamic.tokenizer(first[0][0].text, add_special_tokens=False)["input_ids"][2]
    dynamic.stop_ids = static.stop_ids = [stop]
    static.decoder.stops = torch.tensor([stop])
    static.model.generate = None  # would fail if reached
    want, got = dynamic.generate(PROMPTS, GREEDY, seed=0), static.generate(PROMPTS, GREEDY, seed=0)
    assert got == want
    reasons = {c.finish_reason for completions in got for c in completions}
    assert reasons == {"stop", "length"}
    assert got[0][0].finish_reason == "stop" and got[0][0].num_tokens <= 3


def test_static_cache_sampling_is_seeded_and_draws_from_the_nucleus(lively_model_dir):
    static = backend(lively_model_dir, cache="static", compile=False)
    sampling = Sampling(n=3, temperature=0.65, top_p=0.95, max_new_tokens=6)
    runs = [static.generate(PROMPTS, sampling, seed=s) for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    # at a temperature this high every row is a draw: a prompt's samples differ
    hot = Sampling(n=3, temperature=5.0, top_p=1.0, max_new_tokens=6)
    assert all(len({c.text for c in completions}) > 1 for completions in static.generate(PROMPTS, hot, seed=0))


def test_sampled_sequences_are_seeded(lively_model_dir):
    sampling = Sampling(n=3, temperature=0.65, top_p=0.95, max_new_tokens=6)
    runs = [backend(lively_model_dir).generate(PROMPTS, sampling, seed=s) for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert all(len(c) == 3 for c in runs[0])


@pytest.mark.parametrize("override, message", [
    ("backend.cache=paged", "backend.cache must be one of auto, dynamic, static; got 'paged'"),
    ("backend.compile=true backend.cache=dynamic", "backend.compile=true needs backend.cache=static"),
    ("backend.batch_size=0", "backend.batch_size must be at least 1; got 0"),
    ("backend.name=tgi", "backend.name must be one of auto, vllm, hf; got 'tgi'"),
])
def test_bad_backend_options_are_one_line_errors(override, message, capsys):
    with pytest.raises(ValueError, match=message):
        load_config(["model=x", *override.split()])
    assert main(["run", "model=x", *override.split()]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_compile_on_cpu_is_refused_before_the_model_loads(lively_model_dir, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", None)  # would fail if reached
    with pytest.raises(ValueError, match="backend.compile=true needs a GPU"):
        backend(lively_model_dir, compile=True)
    assert load_config(["model=x"]).backend.cache == "auto"


@pytest.mark.gpu
def test_static_compiled_decoding_on_gpu(lively_model_dir):
    """On CUDA the default is a static cache with infir's compiled decode step: its greedy tokens are the
    dynamic cache's (FP32, so kernels' rounding does not flip an argmax), later generate() calls of the same
    shapes reuse the compiled step, and its draws are seeded."""
    from transformers import AutoTokenizer

    from torch._dynamo.utils import counters

    tokenizer = AutoTokenizer.from_pretrained(lively_model_dir)
    make = lambda **o: HFBackend(lively_model_dir, tokenizer, device="cuda", dtype="float32", batch_size=4, **o)
    compiled, dynamic = make(), make(cache="dynamic")
    assert (compiled.cache, compiled.compile) == ("static", True)
    sampling = Sampling(n=2, temperature=0.0, max_new_tokens=16)
    before = counters["frames"]["ok"]
    assert compiled.generate(PROMPTS[:4], sampling, seed=0) == dynamic.generate(PROMPTS[:4], sampling, seed=0)
    compiled_frames = counters["frames"]["ok"]
    assert compiled_frames > before  # the decode step was compiled
    for _ in range(2):
        assert compiled.generate(PROMPTS[:4], sampling, seed=0) == dynamic.generate(PROMPTS[:4], sampling, seed=0)
    assert counters["frames"]["ok"] == compiled_frames, "a later generate() call compiled the decode step again"
    # sampling inside the CUDA graphs: a seed redraws the same tokens, another seed others
    hot = Sampling(n=2, temperature=1.5, top_p=0.95, max_new_tokens=16)
    runs = [compiled.generate(PROMPTS[:4], hot, seed=s) for s in (3, 3, 4)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
