"""A shard of a parameter (infir.optim.shard_view), stepped by its own optimizer, takes exactly the
whole parameter's step: the data-parallel ranks of a sharded optimizer together equal one rank."""
import pytest
import torch

from infir.optim import build_optimizer, shard_view

CUTS = (0, 256, 640, 768)  # multiples of FlashAdamW's 32-element groups, the last shard ragged


def _param(dtype):
    return torch.randn(8, 96, generator=torch.Generator().manual_seed(0)).to(dtype)


def _grads(step: int):
    return torch.randn(8, 96, generator=torch.Generator().manual_seed(100 + step))


def _shards_step_as_the_whole(name: str, device: str, fused: bool) -> None:
    dtype = torch.float32 if name == "adamw" else torch.bfloat16
    kw = dict(lr=1e-2, weight_decay=0.1, fused=fused)
    whole = _param(dtype).to(device)
    one = build_optimizer(name, [whole], **kw)
    sharded = _param(dtype).to(device)
    views = [shard_view(sharded, a, b, index=0) for a, b in zip(CUTS, CUTS[1:])]
    parts = [build_optimizer(name, [v], **kw) for v in views]
    for step in range(3):
        g = _grads(step).to(device)
        whole.grad = g.to(dtype)
        one.step()
        for v, a, b in zip(views, CUTS, CUTS[1:]):
            v.grad = g.view(-1)[a:b].to(dtype)
        for opt in parts:
            opt.step()
    assert torch.equal(whole, sharded)


@pytest.mark.parametrize("name", ["adamw", "flash_adamw", "sr_adamw", "bf16_adamw_rn"])
def test_shards_step_as_the_whole(name):
    _shards_step_as_the_whole(name, "cpu", fused=False)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["adamw", "flash_adamw", "sr_adamw"])
def test_shards_step_as_the_whole_in_the_fused_kernels(name):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _shards_step_as_the_whole(name, "cuda", fused=True)


def test_a_flash_adamw_shard_must_start_on_a_group():
    p = _param(torch.bfloat16)
    view = shard_view(p, 48, 96, index=0)
    view.grad = torch.zeros_like(view)
    with pytest.raises(ValueError, match="multiple of 32"):
        build_optimizer("flash_adamw", [view], lr=1e-2, fused=False).step()
