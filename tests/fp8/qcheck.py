"""Shared by the FP8 kernel tests: awkward random inputs and a byte-exact QTensor comparison."""
import torch


def rand(shape, device="cpu", dtype=torch.bfloat16, seed=None):
    g = torch.Generator(device=device)
    g.manual_seed(torch.seed() if seed is None else seed)  # fresh inputs every run
    x = torch.randn(shape, generator=g, device=device) * torch.exp(torch.randn(shape, generator=g, device=device) * 2)
    return x.to(dtype)


def assert_same_q(a, b):
    assert a.granularity == b.granularity and a.data.dtype == b.data.dtype
    a_bytes, b_bytes = a.data.view(torch.uint8).cpu(), b.data.view(torch.uint8).cpu()
    diff = (a_bytes != b_bytes).nonzero()
    assert len(diff) == 0, (f"{len(diff)} FP8 bytes differ ({a.granularity}, {a.scale_format}, {a.fmt}), first at "
                            f"{diff[:3].tolist()}: {a_bytes[tuple(diff[0])]} vs {b_bytes[tuple(diff[0])]}")
    assert torch.equal(a.scale.cpu(), b.scale.cpu()), "scales differ"
    if a.granularity == "two_level":
        assert torch.equal(a.global_scale.cpu(), b.global_scale.cpu()) and torch.equal(a.local_exp.cpu(), b.local_exp.cpu())
