"""SFT: loss only on assistant replies, packing that never lets one sample see another."""
import json
import random
import shutil

import pytest
import torch
import torch.nn.functional as F
from cli_messages import messages

from infir.data import DEMO_TOKENIZER
from infir.data.cli import main as prep_main
from infir.data.sft import build_sft_dataset, pack_best_fit, prepare_sft
from infir.model.documents import build_layout, document_ids, reference_mask

pytestmark = pytest.mark.filterwarnings("ignore:Transformer Engine and Apex")

# Written for these tests in the shape of Qwen2.5's template: a default system turn when the
# conversation has none, then ChatML turns.
QWEN_LIKE_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
_WORDS = ["the", "answer", "is", "Romeo", "7", "42", "=", "+", "\\boxed{3}", "naïve", "你好", "🙂", "\n", "  ",
          "thou", "art", ",", ".", "x_1", "<think>", "</think>"]


def _text(rng):
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 40))).strip() or "ok"


def _random_rows(rng, n):
    rows = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.3:
            row = {"prompt": _text(rng), "response": _text(rng)}
            if rng.random() < 0.5:
                row["system"] = _text(rng)
        else:
            msgs = [{"role": "system", "content": _text(rng)}] if kind < 0.6 else []
            for _ in range(rng.randint(1, 3)):
                msgs += [{"role": "user", "content": _text(rng)}, {"role": "assistant", "content": _text(rng)}]
            row = {"messages": msgs}
        rows.append(row)
    return rows


def _assistant_turns(row):
    msgs = row.get("messages") or [{"role": "assistant", "content": row["response"]}]
    return "".join(m["content"] + "<|im_end|>" for m in msgs if m["role"] == "assistant")


def _write(path, rows, extra=b""):
    with open(path, "wb") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False).encode() + b"\n")
        f.write(extra)
    return path


@pytest.fixture(scope="module")
def qwen_like_dir(qwen_tokenizer_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen_like")
    shutil.copy(qwen_tokenizer_dir / "tokenizer.json", d)
    cfg = json.loads((qwen_tokenizer_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = QWEN_LIKE_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("which", ["demo", "qwen_like"])
def test_unmasked_tokens_are_exactly_the_assistant_turns(which, tmp_path, qwen_like_dir):
    from infir.data.tokenizer import load_tokenizer

    tok_dir = DEMO_TOKENIZER if which == "demo" else qwen_like_dir
    rng = random.Random(random.SystemRandom().randint(0, 10**9))
    rows = _random_rows(rng, 150)
    src = _write(tmp_path / "chat.jsonl", rows)
    stats = prepare_sft(src, tmp_path / "sft", tok_dir, seq_length=4096, progress=False)
    assert stats["samples"] == len(rows) and stats["skipped"] == {}
    tok = load_tokenizer(tok_dir, allow_tiktoken=False)
    ds = build_sft_dataset(tmp_path / "sft", 1024)
    assert ds.dropped_overlong == 0
    seen = []
    for i in range(len(ds)):
        item = ds[i]
        doc = document_ids(item["position_ids"])
        for k, sample in enumerate(ds.rows[i]):
            sel = (doc == k + 1) & (item["loss_mask"] > 0)
            assert tok.decode(item["labels"][sel].tolist()) == _assistant_turns(rows[sample])
            seen.append(sample)
    assert sorted(seen) == list(range(len(rows)))


def test_packing_layout_and_attention_isolation(tmp_path):
    rng = random.Random(random.SystemRandom().randint(0, 10**9))
    src = _write(tmp_path / "chat.jsonl", _random_rows(rng, 120))
    prepare_sft(src, tmp_path / "sft", DEMO_TOKENIZER, seq_length=4096, progress=False)
    S = 384
    ds = build_sft_dataset(tmp_path / "sft", S)
    from infir.data.tokenize_corpus import megatron_indexed

    samples = megatron_indexed().IndexedDataset(str(tmp_path / "sft"))
    assert len(ds) < 120  # rows hold several samples
    for i in range(len(ds)):
        item = ds[i]
        pos = item["position_ids"]
        seg = document_ids(pos)  # documents start where positions restart: sample k is document k + 1
        for k, sample in enumerate(ds.rows[i]):
            idx = torch.nonzero(seg == k + 1).flatten()
            assert (idx == torch.arange(idx[0], idx[0] + len(idx))).all()  # contiguous
            assert pos[idx].tolist() == list(range(len(idx)))             # positions restart
            full = samples[sample].tolist()
            assert item["tokens"][idx].tolist() == full[:-1] and item["labels"][idx].tolist() == full[1:]
        pad = seg == len(ds.rows[i]) + 1
        assert (item["loss_mask"][pad] == 0).all()

        # Attention within the trainer's documents equals attending within each sample alone.
        layout = build_layout(pos[None])
        if layout is None:  # one sample fills the row exactly: plain causal attention, nothing to keep apart
            assert len(ds.rows[i]) == 1 and not pad.any()
            continue
        bounds = layout.cu_seqlens_q
        assert bounds[0] == 0 and bounds[-1] == S and len(bounds) == len(ds.rows[i]) + 1 + int(pad.any())
        q, k_, v = (torch.randn(1, 2, S, 8, dtype=torch.float64) for _ in range(3))
        packed = F.scaled_dot_product_attention(q, k_, v, attn_mask=reference_mask(layout))
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            alone = F.scaled_dot_product_attention(q[..., a:b, :], k_[..., a:b, :], v[..., a:b, :], is_causal=True)
            torch.testing.assert_close(packed[..., a:b, :], alone)
    del samples


def test_best_fit_packing_is_complete_and_within_capacity():
    rng = random.Random(random.SystemRandom().randint(0, 10**9))
    lengths = [rng.randint(1, 100) for _ in range(2000)]
    bins = pack_best_fit(lengths, 100)
    assert sorted(i for b in bins for i in b) == list(range(2000))
    assert all(sum(lengths[i] for i in b) <= 100 for b in bins)
    assert len(bins) <= 1.1 * sum(lengths) / 100 + 2  # near the lower bound, not one sample per row
    with pytest.raises(ValueError, match="capacity"):
        pack_best_fit([101], 100)


def test_overlong_samples_dropped_or_truncated_and_counted(tmp_path):
    short = {"prompt": "hi", "response": "hello"}
    long = {"prompt": "count", "response": " ".join(str(i) for i in range(200))}
    src = _write(tmp_path / "c.jsonl", [short, long, short])
    dropped = prepare_sft(src, tmp_path / "d", DEMO_TOKENIZER, seq_length=64, progress=False)
    assert dropped["samples"] == 2 and dropped["skipped"] == {"longer than seq_length": 1}
    kept = prepare_sft(src, tmp_path / "t", DEMO_TOKENIZER, seq_length=64, overlong="truncate", progress=False)
    assert kept["samples"] == 3 and kept["truncated"] == 1
    ds = build_sft_dataset(tmp_path / "t", 64)
    assert ds.dropped_overlong == 0 and all(item["tokens"].shape == (64,) for item in (ds[i] for i in range(len(ds))))
    # A prepared set read at a shorter context drops (and counts) what no longer fits.
    assert build_sft_dataset(tmp_path / "t", 16).dropped_overlong == 1


def test_bad_chat_lines_are_counted_with_line_numbers(tmp_path):
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    bad = (b'{"messages": [{"role": "user", "content": "only a question"}]}\n'
           b'{"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}\n'
           b'{"messages": "nope"}\n'
           b'{"prompt": "q"}\n'
           b'{"messages": [{"role": "assistant", "content": "first"}]}\n'
           b'{oops\n'
           b'{"prompt": "p", "response": "\xff\xfe"}\n')
    src = _write(tmp_path / "c.jsonl", [good], extra=bad)
    stats = prepare_sft(src, tmp_path / "o", DEMO_TOKENIZER, seq_length=64, progress=False)
    assert stats["samples"] == 1
    assert stats["skipped"] == {"no non-empty assistant message": 1, "unknown role 'robot'": 1,
                                "'messages' is not a non-empty list": 1,
                                "neither 'messages' nor 'prompt'/'response' fields": 1,
                                "conversation starts with the assistant": 1, "malformed json": 1, "invalid UTF-8": 1}
    assert [json.loads(x)["line"] for x in open(tmp_path / "o.skipped.jsonl")] == [2, 3, 4, 5, 6, 7, 8]


def test_template_that_rewrites_history_is_refused(tmp_path):
    d = tmp_path / "tok"
    shutil.copytree(DEMO_TOKENIZER, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    # Drops every assistant turn but the last, as reasoning templates do with earlier thoughts.
    cfg["chat_template"] = ("{%- for m in messages -%}{%- if m.role != 'assistant' or loop.last -%}"
                            "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
                            "{%- endif -%}{%- endfor -%}")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                          {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}]
    with pytest.raises(ValueError, match="growing prefixes"):
        prepare_sft(_write(tmp_path / "c.jsonl", rows), tmp_path / "o", d, seq_length=64, progress=False)


def test_cli_sft(tmp_path, capsys):
    src = _write(tmp_path / "c.jsonl", [{"prompt": "2+2?", "response": "4"}] * 3)
    assert prep_main(["sft", "--input", str(src), "--output", str(tmp_path / "o"), "--tokenizer",
                      str(DEMO_TOKENIZER), "--seq-length", "32"]) == 0
    assert "samples=3" in capsys.readouterr().out
    assert prep_main(["sft", "--input", str(src), "--output", str(tmp_path / "o"), "--tokenizer",
                      str(tmp_path / "none"), "--seq-length", "32"]) == 2


@pytest.mark.parametrize("content, message", [
    (b"", "no sample in {src}: the input is empty; nothing written"),
    (b'{"prompt": "q"}\n{"messages": [{"role": "user", "content": "q"}]}\n',
     "no usable sample in {src}: all 2 lines skipped (neither 'messages' nor 'prompt'/'response' fields: 1, "
     "no non-empty assistant message: 1; first: {src}:1: neither"),
    (json.dumps({"prompt": "count", "response": " ".join(map(str, range(100)))}).encode() + b"\n",
     "no usable sample in {src}: all 1 lines skipped (longer than seq_length: 1; first: {src}:1: longer than "
     "seq_length (more than 33 tokens)); raise --seq-length or pass --overlong truncate; nothing written"),
], ids=["empty", "bad lines", "all overlong"])
def test_inputs_without_a_usable_sample_fail_naming_them_and_write_nothing(tmp_path, capsys, content, message):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    assert prep_main(["sft", "--input", str(src), "--output", str(tmp_path / "o"), "--tokenizer", str(DEMO_TOKENIZER),
                      "--seq-length", "32"]) == 2
    err = messages(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith(f"infir-prep sft: error: {message.format(src=src)}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
