"""Stepping inside backward (gradient release) and offloaded states: both must give the very
same weights and states as a plain ``step()`` after backward."""
import pytest
import torch

from infir.optim import FlashAdamW, SRAdamW, build_optimizer, enable_step_in_backward


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.Tanh(), torch.nn.Linear(48, 48),
                               torch.nn.Tanh(), torch.nn.Linear(48, 4)).to(torch.bfloat16)


def _batches(n: int):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(8, 24, generator=gen).to(torch.bfloat16) for _ in range(n)]


def _loss(model, x):
    return model(x).float().pow(2).mean()


def _snapshot(model, opt):
    return [p.detach().clone() for p in model.parameters()], [
        {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
        for p in model.parameters()]


def _assert_same(a, b):
    for x, y in zip(a[0], b[0]):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    for sa, sb in zip(a[1], b[1]):
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]) if torch.is_tensor(sa[k]) else sa[k] == sb[k], k


def _plain(cls, accum: int, **kw):
    model = _model()
    opt = cls(model.parameters(), lr=1e-2, fused=False, **kw)
    batches = _batches(3 * accum)
    for step in range(3):
        for x in batches[step * accum:(step + 1) * accum]:
            _loss(model, x).backward()
        opt.step()
        opt.zero_grad()
    return _snapshot(model, opt)


def _in_backward(cls, accum: int, **kw):
    model = _model()
    opt = cls(model.parameters(), lr=1e-2, fused=False, **kw)
    handle = enable_step_in_backward(opt, model)
    batches = _batches(3 * accum)
    for step in range(3):
        for i, x in enumerate(batches[step * accum:(step + 1) * accum]):
            handle.armed = i == accum - 1  # accumulate, then step during the last backward
            _loss(model, x).backward()
            if handle.armed:
                # released: no gradient outlives its step
                assert all(p.grad is None for p in model.parameters())
            else:
                assert all(p.grad is not None for p in model.parameters())
        opt.step()  # steps nothing twice
        opt.zero_grad()
    handle.remove()
    return _snapshot(model, opt)


@pytest.mark.parametrize("cls", [FlashAdamW, SRAdamW])
@pytest.mark.parametrize("accum", [1, 3])
def test_step_in_backward_equals_step_after_backward(cls, accum):
    _assert_same(_plain(cls, accum), _in_backward(cls, accum))


@pytest.mark.parametrize("cls", [FlashAdamW, SRAdamW])
def test_offloaded_states_give_the_same_result(cls):
    plain = _plain(cls, 2)
    offloaded = _plain(cls, 2, offload=True)
    _assert_same(plain, offloaded)
    assert _in_backward(cls, 2, offload=True)[0][0].dtype == torch.bfloat16
    _assert_same(plain, _in_backward(cls, 2, offload=True))


@pytest.mark.parametrize("name,kw", [("offload_adamw", {}), ("flash_adamw", {"offload": True})])
def test_offload_checkpoint_round_trip(name, kw):
    """Through torch.save, as the trainer checkpoints: packed states of several dtypes once made
    it refuse the optimizer's state dict."""
    import io
    model = _model()
    opt = build_optimizer(name, model.parameters(), lr=1e-2, fused=False, **kw)
    assert opt.offload
    _loss(model, _batches(1)[0]).backward()
    opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    opt2 = build_optimizer(name, model.parameters(), lr=1e-2, fused=False, **kw)
    opt2.load_state_dict(torch.load(buf))
    for p in model.parameters():
        for k, v in opt.state[p].items():
            assert torch.equal(v, opt2.state[p][k]) if torch.is_tensor(v) else v == opt2.state[p][k]


@pytest.mark.parametrize("offload", [False, True])
def test_step_in_backward_does_not_keep_the_model_alive(offload):
    # hooks live on the params, partly in C++ where gc cannot see a reference cycle
    import gc
    import weakref
    model = _model()
    opt = FlashAdamW(model.parameters(), fused=False, offload=offload)
    enable_step_in_backward(opt, model)
    _loss(model, _batches(1)[0]).backward()
    opt.step()
    refs = [weakref.ref(model), weakref.ref(opt), weakref.ref(next(model.parameters()))]
    del model, opt
    gc.collect()
    assert all(r() is None for r in refs)


def test_step_in_backward_refuses_data_parallel_gradients():
    model = _model()
    opt = FlashAdamW(model.parameters())

    class DistributedDataParallel(torch.nn.Module):  # stands in for torch's and megatron's
        pass

    with pytest.raises(TypeError, match="DistributedDataParallel.*optimizer.step\\(\\) after"):
        enable_step_in_backward(opt, DistributedDataParallel())
    for p in model.parameters():
        p.main_grad = torch.zeros_like(p, dtype=torch.float32)
    with pytest.raises(TypeError, match="main_grad"):
        enable_step_in_backward(opt, model)


def test_step_in_backward_refuses_torch_optimizers():
    model = _model().float()
    with pytest.raises(TypeError, match="step_param"):
        enable_step_in_backward(torch.optim.AdamW(model.parameters()), model)


def test_registry_names_dtypes_and_errors():
    model = _model()
    for name in ("flash_adamw", "sr_adamw", "bf16_adamw_rn", "offload_adamw"):
        opt = build_optimizer(name, model.parameters(), lr=1e-3)
        assert opt.defaults["lr"] == 1e-3 and opt.defaults["betas"] == (0.9, 0.999)
    assert isinstance(build_optimizer("adamw", _model().float().parameters()), torch.optim.AdamW)
    with pytest.raises(KeyError, match="choose one of"):
        build_optimizer("adam8bit", model.parameters())
    with pytest.raises(TypeError, match="cast the model"):
        build_optimizer("adamw", model.parameters())


@pytest.mark.parametrize("cls", [FlashAdamW, SRAdamW])
@pytest.mark.parametrize("offload", [True, False])
def test_states_are_packed_in_one_buffer_per_param(cls, offload):
    """One buffer per param, each state at a 64-byte aligned offset: offloaded, a step moves it
    with one H2D and one D2H copy; on the device, the allocator holds one block instead of five.
    A checkpoint reload packs the states again, with the same bits."""
    from infir.optim.packing import packed_buffer
    model = _model()
    opt = cls(model.parameters(), lr=1e-2, fused=False, offload=offload)
    _loss(model, _batches(1)[0]).backward()
    opt.step()
    for p in model.parameters():
        tensors = {k: v for k, v in opt.state[p].items() if torch.is_tensor(v)}
        buf = packed_buffer(tensors)
        assert buf is not None and buf.numel() >= sum(t.numel() * t.element_size()
                                                      for t in tensors.values())
        assert all(t.data_ptr() % 64 == 0 for t in tensors.values())
    opt2 = cls(model.parameters(), lr=1e-2, fused=False, offload=offload)
    opt2.load_state_dict(opt.state_dict())
    for p in model.parameters():
        tensors = {k: v for k, v in opt2.state[p].items() if torch.is_tensor(v)}
        assert packed_buffer(tensors) is not None
        for k, v in tensors.items():
            assert v.dtype == opt.state[p][k].dtype and torch.equal(v, opt.state[p][k])
