"""infir.optim.step_together against each optimizer's own step: the same parameters and states, bit for bit."""
from __future__ import annotations

import copy

import pytest
import torch

from infir.optim.together import _batchable, step_together


def _optimizers(kind: str, n: int = 5, device: str = "cpu") -> list[torch.optim.Optimizer]:
    torch.manual_seed(0)
    out = []
    for i in range(n):
        decay = [torch.nn.Parameter(torch.randn(64 + 16 * i, 32, device=device)) for _ in range(2)]
        plain = [torch.nn.Parameter(torch.randn(32, device=device))]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}]
        kw = {"fused": True} if kind == "fused" else {"foreach": kind == "foreach"}
        out.append(torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, **kw))
    return out


def _grads(optimizers, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    for o in optimizers:
        for group in o.param_groups:
            for p in group["params"]:
                p.grad = torch.randn(p.shape, generator=g).to(p.device)


@pytest.mark.parametrize("kind", ["foreach", "for-loop", "fused"])
def test_adamw_optimizers_stepped_together_match_their_own_steps(kind, device="cpu"):
    apart = _optimizers(kind, device=device)
    together = copy.deepcopy(apart)
    assert all(_batchable(o) for o in together)  # the batched call, not the one-by-one fallback, is what runs
    scale = torch.tensor(2.0, device=device)
    for step in range(3):
        for opts in (apart, together):
            _grads(opts, step)
            for o in opts:
                o.grad_scale = scale if kind == "fused" else None  # the fused kernel divides the gradients by it
                for group in o.param_groups:
                    group["lr"] = 1e-3 * (step + 1)  # the trainer sets each step's learning rate on every group
        for o in apart:
            o.step()
        step_together(together)
    for a, b in zip(apart, together):
        for ga, gb in zip(a.param_groups, b.param_groups):
            for p, q in zip(ga["params"], gb["params"]):
                assert torch.equal(p, q)
                assert all(torch.equal(a.state[p][k], b.state[q][k]) for k in a.state[p])
        assert a.state_dict()["state"].keys() == b.state_dict()["state"].keys()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; run `pytest -m gpu` on a GPU host")
@pytest.mark.parametrize("kind", ["foreach", "fused"])
def test_gpu_adamw_optimizers_stepped_together_match_their_own_steps(kind):
    """The trainer's case: fused AdamW on CUDA, the clipping divisor inside its kernel."""
    test_adamw_optimizers_stepped_together_match_their_own_steps(kind, device="cuda")


def test_other_optimizers_step_on_their_own_and_mixed_scales_are_refused():
    sgd_param = torch.nn.Parameter(torch.ones(4))
    sgd = torch.optim.SGD([sgd_param], lr=0.5)
    sgd_param.grad = torch.ones(4)
    adams = _optimizers("foreach", 2)
    _grads(adams, 0)
    step_together([sgd, *adams])
    assert torch.equal(sgd_param.detach(), torch.full((4,), 0.5))
    adams[0].grad_scale = torch.tensor(1.0)
    with pytest.raises(ValueError, match="grad_scale"):
        step_together(adams)
