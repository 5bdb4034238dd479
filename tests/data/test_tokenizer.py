"""Tokenizer loading: the tiktoken fast path gives exactly HF's ids; bad directories fail clearly."""
import random

import pytest

from infir.data import DEMO_TOKENIZER
from infir.data.shakespeare import shakespeare_documents
from infir.data.tokenizer import TokenizerNotFound, load_tokenizer

_RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x391, 0x3C9), (0x400, 0x4FF), (0x600, 0x6FF),
           (0x4E00, 0x4FFF), (0x3040, 0x30FF), (0xAC00, 0xAD00), (0x1F300, 0x1F64F), (0xFB00, 0xFB06)]
_PIECES = [" ", "  ", "\n", "\n\n", "\r\n", "\t", "'s", "'LL", "123", "4567890", "e\u0301", "A\u030a",
           "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|", "|>", "...", "!!", "  \n "]


def _random_text(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(0, 60)):
        if rng.random() < 0.3:
            out.append(rng.choice(_PIECES))
        else:
            lo, hi = rng.choice(_RANGES)
            out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8))))
    return "".join(out)


def test_tiktoken_fast_path_matches_hf_ids(qwen_tokenizer_dir):
    fast = load_tokenizer(qwen_tokenizer_dir)
    slow = load_tokenizer(qwen_tokenizer_dir, allow_tiktoken=False)
    assert (fast.backend, slow.backend) == ("tiktoken", "hf")
    assert fast.eod == slow.eod == 151643 and fast.vocab_size == slow.vocab_size == 151646
    rng = random.Random(1234 + random.SystemRandom().randint(0, 10**6))  # fresh inputs each run
    texts = [_random_text(rng) for _ in range(3000)]
    texts += [d["text"] for d in list(shakespeare_documents())[:40]]
    assert fast.encode_batch(texts) == slow.encode_batch(texts)
    plain = [t for t in texts if "<|" not in t]  # the batch path without special tokens
    assert len(plain) > 500 and fast.encode_batch(plain) == slow.encode_batch(plain)


def test_fast_path_only_for_the_qwen_vocabulary():
    assert load_tokenizer(DEMO_TOKENIZER).backend == "hf"


def test_missing_tokenizer_names_the_fix(tmp_path):
    with pytest.raises(TokenizerNotFound, match="tokenizer.json.*--tokenizer DIR"):
        load_tokenizer(tmp_path / "nope")


def test_tokenizer_without_eod_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE()).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="<\\|endoftext\\|>"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("which", ["demo", "qwen_tiktoken", "qwen_hf"])
def test_pieces_encode_to_the_ids_of_the_whole_text(which, qwen_tokenizer_dir, monkeypatch):
    import infir.data.tokenizer as tokenizer

    monkeypatch.setattr(tokenizer, "PIECE_CHARS", 40)  # a cut every few words of the random text
    path = DEMO_TOKENIZER if which == "demo" else qwen_tokenizer_dir
    tok = load_tokenizer(path, allow_tiktoken=which == "qwen_tiktoken")
    assert tok.cuttable and tok.backend == ("tiktoken" if which == "qwen_tiktoken" else "hf")
    rng = random.Random(99 + random.SystemRandom().randint(0, 10**6))  # fresh inputs each run
    texts = ["".join(_random_text(rng) for _ in range(20)) for _ in range(60)]
    texts += ["\n".join(d["text"] for d in list(shakespeare_documents())[:3])]
    cut = 0
    for text in texts:
        pieces = [p for _, p in tok.pieces(text)]
        cut += len(pieces) - 1
        assert "".join(pieces) == text
        assert [i for ids in tok.encode_long(text) for i in ids] == tok.encode(text)
    assert cut > 200  # the random texts were cut, many times


def test_a_text_that_cannot_be_cut_is_refused_with_the_limit(monkeypatch):
    import infir.data.tokenizer as tokenizer

    monkeypatch.setattr(tokenizer, "PIECE_CHARS", 10)
    monkeypatch.setattr(tokenizer, "MAX_PIECE_CHARS", 100)
    tok = load_tokenizer(DEMO_TOKENIZER)
    assert len(list(tok.pieces("word " * 100))) > 5
    with pytest.raises(tokenizer.TextTooLong, match="more than 100 characters with no line break or space"):
        list(tok.pieces("x" * 101))


def test_a_corrupt_tokenizer_file_is_named(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {')
    with pytest.raises(ValueError, match=f"{tmp_path / 'tokenizer.json'} is not a readable HF tokenizer file"):
        load_tokenizer(tmp_path)
