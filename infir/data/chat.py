"""Chat samples -> token ids + a loss mask that is 1 exactly on the assistant's tokens.

Accepted rows: ``{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}`` or
``{"prompt": str, "response": str}`` (optional ``"system": str``), the common SFT layouts.

The text comes from the tokenizer directory's own chat template (Qwen2.5's ChatML for real runs);
a directory without one falls back to ``infir.data.bpe.CHATML_TEMPLATE`` (ChatML without a default
system prompt), which is also what the demo tokenizer ships. Assistant spans are found by
rendering, not by parsing: for assistant turn i, ``render(messages[:i], add_generation_prompt)`` is
the text before the reply and ``render(messages[:i+1])`` the text through it, so any template that
renders a conversation as a growing prefix works. The trained span is the reply through the
template's end-of-turn token (``<|im_end|>``), not the role header and not the newline after the
end token: the model learns to answer and to stop.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from infir.data.bpe import CHATML_TEMPLATE, IM_END
from infir.data.tokenizer import TextTokenizer, TextTooLong, load_tokenizer

ROLES = ("system", "user", "assistant")


class BadSample(ValueError):
    """A sample that cannot be trained on; the message is the reason that gets counted."""


def to_messages(row: dict) -> list[dict]:
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise BadSample("'messages' is not a non-empty list")
        out = []
        for m in msgs:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise BadSample("a message lacks 'role' or 'content'")
            if m["role"] not in ROLES:
                raise BadSample(f"unknown role '{m['role']}'")
            if not isinstance(m["content"], str):
                raise BadSample("a message's content is not a string")
            out.append({"role": m["role"], "content": m["content"]})
    elif "prompt" in row and "response" in row:
        if not isinstance(row["prompt"], str) or not isinstance(row["response"], str):
            raise BadSample("'prompt' or 'response' is not a string")
        out = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["response"]}]
        if isinstance(row.get("system"), str) and row["system"]:
            out.insert(0, {"role": "system", "content": row["system"]})
    else:
        raise BadSample("neither 'messages' nor 'prompt'/'response' fields")
    if not any(m["role"] == "assistant" and m["content"].strip() for m in out):
        raise BadSample("no non-empty assistant message")
    if out[0]["role"] == "assistant":
        raise BadSample("conversation starts with the assistant")
    return out


class ChatFormatter:
    """Render conversations with a tokenizer's chat template and mark the assistant tokens."""

    def __init__(self, tokenizer_dir: Path | str):
        self.tok: TextTokenizer = load_tokenizer(tokenizer_dir, allow_tiktoken=False)  # offsets come from HF
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from transformers import AutoTokenizer

            try:
                self.hf = AutoTokenizer.from_pretrained(str(self.tok.path))
            except (OSError, ValueError) as err:  # tokenizer.json read; tokenizer_config.json or a sibling did not
                raise ValueError(f"transformers cannot load the tokenizer in {self.tok.path} ({err}): its "
                                 "tokenizer_config.json or another file there is truncated or corrupt") from None
        self.uses_fallback_template = not getattr(self.hf, "chat_template", None)
        self.template = CHATML_TEMPLATE if self.uses_fallback_template else None

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                           chat_template=self.template)

    def assistant_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the character spans the loss is taken on."""
        text = self.render(messages)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True)
            through = self.render(messages[:i + 1])
            if not (text.startswith(before) and text.startswith(through) and len(before) <= len(through)):
                raise ValueError(
                    "the chat template does not render conversations as growing prefixes (it rewrites "
                    "earlier turns), so assistant spans cannot be located; use a ChatML template such as Qwen2.5's")
            end = len(through)
            stop = text.rfind(IM_END, len(before), end)
            if stop >= 0:
                end = stop + len(IM_END)
            spans.append((len(before), end))
        return text, spans

    def encode(self, messages: list[dict], max_tokens: int | None = None) -> tuple[list[int], list[int]]:
        """``(ids, mask)``: mask[j] = 1 where token j belongs to an assistant reply.

        With ``max_tokens``, only the first ``max_tokens`` tokens: the text is encoded piece by piece
        (``TextTokenizer.pieces``) and encoding stops there, so an overlong sample costs the memory of
        ``max_tokens`` tokens, not of its whole text.
        """
        text, spans = self.assistant_spans(messages)
        ids: list[int] = []
        mask: list[int] = []
        try:
            for offset, piece in self.tok.pieces(text):
                enc = self.tok.hf.encode(piece, add_special_tokens=False)
                ids += enc.ids
                mask += [int(any(s <= offset + start < e for s, e in spans)) for start, _ in enc.offsets]
                if max_tokens is not None and len(ids) >= max_tokens:
                    return ids[:max_tokens], mask[:max_tokens]
        except TextTooLong as err:
            raise BadSample(str(err)) from None
        return ids, mask
