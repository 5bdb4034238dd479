"""SRAdamW / BF16AdamW: the fused kernel against its twin, and the failure that stochastic
rounding fixes, on a single update."""
import pytest
import torch

from infir.optim import BF16AdamW, SRAdamW
from infir.optim.adam_math import AdamScalars
from infir.optim.sr_adamw import sr_adamw_reference


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs the kernel in Triton's CPU "
                    "interpreter; on a GPU host test_gpu.py checks the compiled kernel")
@pytest.mark.parametrize("seed", [7, None])
def test_triton_kernel_matches_twin_bitwise(seed):
    from infir.optim.sr_adamw_triton import _sr_adamw_kernel, sr_adamw_triton_, sr_noise_triton
    assert "Interpret" in type(_sr_adamw_kernel).__name__, "set TRITON_INTERPRET=1 before import"
    gen = torch.Generator().manual_seed(5)
    n = 2500
    p = torch.randn(n, generator=gen).to(torch.bfloat16)
    m = (torch.randn(n, generator=gen) * 1e-3).to(torch.bfloat16)
    v = (torch.rand(n, generator=gen) * 1e-6).to(torch.bfloat16)
    g = (torch.randn(n, generator=gen) * 1e-2).to(torch.bfloat16)
    s = AdamScalars.of(1e-3, 0.9, 0.95, 1e-8, 0.1, 3)
    noise = None if seed is None else sr_noise_triton(p.shape, seed, p.device)
    expected = sr_adamw_reference(p, g, m, v, s, noise)
    got = [p.clone(), m.clone(), v.clone()]
    sr_adamw_triton_(*got[:1], g, *got[1:], s, seed)
    for name, e, k in zip(("param", "exp_avg", "exp_avg_sq"), expected, got):
        assert torch.equal(e.view(torch.int16), k.view(torch.int16)), name
    if noise is not None:
        # the noise is uniform on [0, 2**16): mean 2**15 within 1% over 7500 draws
        assert abs(noise.float().mean().item() / 2 ** 15 - 1) < 0.01


def _small_update_run(cls, steps: int = 200):
    # weights of 1.0 (bf16 ULP 2**-7) moved by lr 1e-4 per step (Adam's unit step on a constant
    # gradient): each update is 1/78 of a ULP, far below the half ULP round-to-nearest keeps
    p = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
    opt = cls([p], lr=1e-4, weight_decay=0.0, fused=False)
    for _ in range(steps):
        p.grad = torch.full_like(p, -1.0)
        opt.step()
    return p.detach().float()


def test_round_to_nearest_loses_small_updates_and_stochastic_rounding_keeps_them():
    expected = 1.0 + 200 * 1e-4
    rn = _small_update_run(BF16AdamW)
    sr = _small_update_run(SRAdamW)
    assert torch.equal(rn, torch.ones_like(rn)), "round-to-nearest should have dropped them all"
    # SR: each weight is a sum of 200 Bernoulli steps of one ULP; the mean over 4096 weights
    # lands within 1% of the true displacement
    assert abs((sr.mean().item() - 1.0) / (expected - 1.0) - 1) < 0.01


def test_replicas_with_the_same_seed_stay_identical():
    def run(seed):
        torch.manual_seed(0)
        lin = torch.nn.Linear(16, 16).to(torch.bfloat16)
        opt = SRAdamW(lin.parameters(), lr=1e-3, seed=seed, fused=False)
        for i in range(3):
            x = torch.randn(4, 16, generator=torch.Generator().manual_seed(i)).bfloat16()
            lin(x).float().sum().backward()
            opt.step()
            opt.zero_grad()
        return torch.cat([p.detach().float().flatten() for p in lin.parameters()])
    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))


def test_rejects_fp32_params_with_a_clear_message():
    with pytest.raises(TypeError, match="bfloat16"):
        SRAdamW([torch.nn.Parameter(torch.zeros(3))])
