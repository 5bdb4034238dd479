"""Tiny-GPT convergence on CPU: FlashAdamW and SRAdamW end within 1% of fp32 AdamW, bf16 AdamW
with round-to-nearest measurably worse (the talk's failing row, shared/seeds/004 slide 17).

Why this setup fails for round-to-nearest: at lr 3e-4 Adam moves a weight by <= 3e-4 per step,
below half a bf16 ULP for every weight above ~0.08 in magnitude (and for all LayerNorm gains,
at 1.0), so those updates round away; fp32 master weights, split master weights and stochastic
rounding all keep them. Same seed, same data order, 300 steps for each optimizer."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from infir.optim import build_optimizer, optimizer_spec

VOCAB, SEQ, BATCH, STEPS, LR = 64, 32, 8, 300, 3e-4


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc, self.out = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """2 layers, width 64: ~0.1M parameters."""

    def __init__(self, d: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(SEQ, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def markov_stream(n_seq: int, seed: int = 0) -> torch.Tensor:
    """Sequences from a fixed random first-order Markov chain with peaked transitions
    (Dirichlet(0.1) rows): learnable structure, and a loss floor well below ln(64)."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch._standard_gamma(torch.full((VOCAB, VOCAB), 0.1), generator=gen)
    cdf = (rows / rows.sum(-1, keepdim=True)).cumsum(-1)
    toks = torch.empty(n_seq, SEQ + 1, dtype=torch.long)
    toks[:, 0] = torch.randint(0, VOCAB, (n_seq,), generator=gen)
    u = torch.rand(n_seq, SEQ + 1, generator=gen)
    for t in range(1, SEQ + 1):
        nxt = torch.searchsorted(cdf[toks[:, t - 1]], u[:, t:t + 1].contiguous()).squeeze(1)
        toks[:, t] = nxt.clamp_max(VOCAB - 1)
    return toks


def final_loss(name: str, data: torch.Tensor) -> float:
    torch.manual_seed(0)
    model = TinyGPT().to(optimizer_spec(name).param_dtype)
    opt = build_optimizer(name, model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for i in range(STEPS):
        batch = data[i * BATCH:(i + 1) * BATCH]
        logits = model(batch[:, :-1]).float()
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return sum(losses[-50:]) / 50  # mean of the last 50 steps: the same batches for everyone


@pytest.mark.slow
def test_flash_and_sr_match_fp32_adamw_and_round_to_nearest_does_not():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI box is shared: one thread is faster than two contended
    try:
        data = markov_stream(STEPS * BATCH)
        loss = {name: final_loss(name, data)
                for name in ("adamw", "flash_adamw", "sr_adamw", "bf16_adamw_rn")}
    finally:
        torch.set_num_threads(threads)
    report = ", ".join(f"{k} {v:.4f}" for k, v in loss.items())
    assert loss["adamw"] < 3.6, f"fp32 AdamW did not learn (ln 64 = 4.16): {report}"
    assert abs(loss["flash_adamw"] / loss["adamw"] - 1) < 0.01, report
    assert abs(loss["sr_adamw"] / loss["adamw"] - 1) < 0.01, report
    # observed: +9.5% and +9.8% on two seeds; 3% leaves room for noise and still is a failure
    assert loss["bf16_adamw_rn"] > 1.03 * loss["adamw"], report
    print(report)
