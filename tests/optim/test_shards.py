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


@pytest.mark.parametrize("name", ["adamw", "flash_adamw", "sr_adamw"])
def test_states_recut_into_other_shards_continue_the_same_steps(name):
    """Shard states joined per parameter and cut at other boundaries (ranges.py: a checkpoint resumed at
    another data-parallel size) carry on exactly as the whole parameter's optimizer does."""
    from infir.optim.base import unpacked_state
    from infir.optim.ranges import merge_ranges, state_range

    dtype = torch.float32 if name == "adamw" else torch.bfloat16
    kw = dict(lr=1e-2, weight_decay=0.1, fused=False)
    whole = _param(dtype)
    one = build_optimizer(name, [whole], **kw)
    sharded = _param(dtype)

    def run(cuts, views, opts, steps):
        for step in steps:
            g = _grads(step)
            for v, a, b in zip(views, cuts, cuts[1:]):
                v.grad = g.view(-1)[a:b].to(dtype)
            for opt in opts:
                opt.step()

    for step in range(3):
        whole.grad = _grads(step).to(dtype)
        one.step()
    views = [shard_view(sharded, a, b, index=0) for a, b in zip(CUTS, CUTS[1:])]
    opts = [build_optimizer(name, [v], **kw) for v in views]
    run(CUTS, views, opts, range(2))
    grouped = getattr(opts[0], "GROUPED_STATES", {})
    pieces = [(a, b - a, unpacked_state(o.state_dict()["state"][0])) for o, a, b in zip(opts, CUTS, CUTS[1:])]
    merged = merge_ranges(pieces, whole.numel(), grouped)
    other = (0, 384, 768)
    new_views = [shard_view(sharded, a, b, index=0) for a, b in zip(other, other[1:])]
    new_opts = [build_optimizer(name, [v], **kw) for v in new_views]
    for o, v, a, b in zip(new_opts, new_views, other, other[1:]):
        sd = o.state_dict()
        sd["state"] = {0: state_range(merged, a, b, v.shape, grouped)}
        o.load_state_dict(sd)
    run(other, new_views, new_opts, [2])
    assert torch.equal(whole, sharded)
