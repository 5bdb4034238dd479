from dataclasses import replace

import torch

from infir.fp8 import Fp8Linear


def adamw_run(layer, steps, lr, x):
    opt = torch.optim.AdamW(layer.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    predicted, true = [], []
    for _ in range(steps):
        opt.zero_grad()
        layer(x).pow(2).mean().backward()
        opt.step()
        layer.weight_cache.step(lr)
        layer(x)  # the next step's quantization uses the predicted scale
        a = layer.weight_cache.autoscaler
        predicted.append(float(a.predicted_amax()))
        true.append(float(layer.weight.detach().abs().max()))
    return predicted, true


def test_moss_predicted_scale_bounds_adamw_weights_and_resyncs():
    torch.manual_seed(0)
    layer = Fp8Linear(64, 32, bias=False, recipe="moss")
    layer.recipe = replace(layer.recipe, resync_interval=5)
    x = torch.randn(16, 64)
    amax0 = float(layer.weight.detach().abs().max())
    predicted, true = adamw_run(layer, 12, 1e-2, x)
    a = layer.weight_cache.autoscaler
    assert all(p >= t for p, t in zip(predicted, true)), "Eq. 10 bound violated under AdamW"
    assert abs(predicted[0] - (amax0 + 1e-2)) < 1e-6  # amax_0 + lr after one step
    assert a.resyncs == 3  # at start, after 5 and after 10 steps
    assert int(a.exceeded) == 0
    q = layer.weight_cache.q
    assert torch.equal(q.scale, torch.tensor(predicted[-1] / 448, dtype=torch.float32))


def test_autoscale_counts_steps_where_true_amax_beats_prediction():
    layer = Fp8Linear(64, 32, bias=False, recipe="moss")
    x = torch.randn(4, 64)
    layer(x)
    a = layer.weight_cache.autoscaler
    with torch.no_grad():
        layer.weight.mul_(3.0)  # a jump no learning rate explains
    layer.weight_cache.step(1e-4)
    layer(x)
    assert int(a.exceeded) == 1
    assert layer.weight_cache.q.data.float().abs().max() == 448  # saturated, not NaN
