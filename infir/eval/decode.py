"""Batched sampling from a transformers causal LM over a static KV cache, each decode step one compiled call.

Why not transformers' `generate` for this: around its compiled forward, each token's step runs the logits
processors (temperature, top-p's sort over the vocabulary), the stopping criteria and an all-finished check
that waits for the GPU, eagerly in Python. For a small model at a large batch that loop, not the model, sets
the step (bench/generate.py times both: modes static and hf-static). Here a step's forward, temperature,
top-p sampling and end-of-sequence bookkeeping are one compiled function (CUDA graphs on a GPU, through
torch.compile's reduce-overhead mode), and the host asks whether every row has ended every CHECK_EVERY steps.

The model's own attention masks are used: the 2D mask spans the whole cache (ones from each row's first
real token on, left padding zero), so it stays the same for the whole call and causality hides the
positions not yet written. Position ids count from each row's first real token, as transformers' generate
counts them.
"""
from __future__ import annotations

import inspect

import torch

CHECK_EVERY = 16  # decode steps between the host's checks that every row has ended (each check waits for the GPU)


def top_p_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Softmax of logits / temperature with the tokens outside the top-p nucleus zeroed (not renormalized):
    a token is kept while the probability of the tokens ranked above it is below top_p, so the most likely
    token always is (transformers' TopPLogitsWarper, min_tokens_to_keep=1)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    ranked, order = probs.sort(dim=-1, descending=True)
    above = ranked.cumsum(dim=-1) - ranked
    ranked = ranked.masked_fill(above >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, ranked)


def sample(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """One token per row of logits [rows, vocab]: argmax at temperature 0, else drawn from the top-p nucleus.
    The draw is argmax(p / E) with E ~ Exp(1) per entry, which picks token i with probability p_i / sum(p):
    unlike torch.multinomial it is a few elementwise ops and a reduction, which compile into the step."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = top_p_probs(logits, temperature, top_p)
    return (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1)


class StaticDecoder:
    """Generates from left-padded rows with a static KV cache of a fixed length, kept (and reset) from call
    to call, so that calls of one (rows, cache length) shape reuse one compiled step."""

    def __init__(self, model, stop_ids: list[int], pad_id: int, compile: bool):
        from infir.eval.gqa_decode import use_gqa_decode

        use_gqa_decode(model)  # decode steps attend over the cache without copies of it per query head
        self.model, self.pad_id, self.compile = model, pad_id, compile
        self.stops = torch.tensor(stop_ids, device=model.device)
        # transformers renamed the forward's past_key_values to cache: name it as this version does
        self.cache_arg = "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"
        self.cache, self.shape = None, None
        # as transformers compiles its decode step: no fullgraph (a version's forward may break the graph), and
        # static shapes, one graph per (rows, cache length)
        self.step = torch.compile(self._step, mode="reduce-overhead", dynamic=False) if compile else self._step

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits of the last position of ids [rows, n], whose keys and values the cache appends."""
        kwargs = {self.cache_arg: self.cache, "use_cache": True, "logits_to_keep": 1}
        return self.model(ids, attention_mask=mask, position_ids=positions, **kwargs).logits[:, -1]

    def _step(self, token, positions, mask, done, temperature: float, top_p: float):
        nxt = sample(self._forward(token, mask, positions), temperature, top_p)
        nxt = torch.where(done, self.pad_id, nxt)
        return nxt, done | torch.isin(nxt, self.stops)

    def _next(self, *args):
        """One decode step. Under CUDA graphs the step's outputs live in the graph's memory, which its next
        replay overwrites while they are that replay's inputs: each call starts a new graph step and hands
        back copies."""
        if not self.compile:
            return self.step(*args)
        torch.compiler.cudagraph_mark_step_begin()
        return tuple(t.clone() for t in self.step(*args))

    def _reset(self, rows: int, cache_len: int) -> None:
        if self.shape != (rows, cache_len):
            from transformers import StaticCache

            self.cache, self.shape = StaticCache(config=self.model.config, max_cache_len=cache_len), (rows, cache_len)
        else:
            self.cache.reset()

    @torch.inference_mode()
    def generate(self, ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, temperature: float,
                 top_p: float, cache_len: int) -> torch.Tensor:
        """The new tokens [rows, max_new_tokens] after left-padded prompts ids [rows, n] (pad_id after a row's
        end); cache_len >= n + max_new_tokens."""
        rows, n = ids.shape
        if cache_len < n + max_new_tokens:
            raise ValueError(f"StaticDecoder: a cache of {cache_len} positions cannot hold {n} prompt and "
                             f"{max_new_tokens} new tokens")
        self._reset(rows, cache_len)
        device = ids.device
        pads = n - attention_mask.sum(dim=1, keepdim=True)
        mask = (torch.arange(cache_len, device=device) >= pads).long()  # each row's real tokens, now and to come
        positions = (torch.arange(n, device=device) - pads).clamp(min=0)
        token = sample(self._forward(ids, mask, positions), temperature, top_p)
        done = torch.isin(token, self.stops)
        out = torch.full((rows, max_new_tokens), self.pad_id, dtype=ids.dtype, device=device)
        out[:, 0] = token
        for i in range(1, max_new_tokens):
            # the token fed in is at cache position n + i - 1
            token, done = self._next(token[:, None], n + i - 1 - pads, mask, done, temperature, top_p)
            out[:, i] = token
            if i % CHECK_EVERY == 0 and bool(done.all()):
                break
        return out
