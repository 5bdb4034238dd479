import math

import pytest

from infir.train.schedule import lr_at, resolve_warmup


def test_cosine_warms_up_linearly_then_decays_to_min():
    kw = dict(total=100, lr=1.0, min_lr=0.1, warmup=10, schedule="cosine")
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    mid = lr_at(55, **kw)  # halfway through the decay
    assert mid == pytest.approx(0.1 + 0.9 * 0.5, rel=1e-6)
    assert lr_at(100, **kw) == pytest.approx(0.1)
    decay = [lr_at(s, **kw) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))


def test_wsd_is_constant_then_decays_over_the_last_steps():
    kw = dict(total=100, lr=1e-4, min_lr=1e-5, warmup=10, schedule="wsd", decay=20)
    assert lr_at(50, **kw) == 1e-4
    assert lr_at(79, **kw) == 1e-4
    assert lr_at(80, **kw) < 1e-4
    assert lr_at(99, **kw) == pytest.approx(1e-5)


def test_fractional_warmup_is_a_share_of_all_steps():
    assert resolve_warmup(0.05, 1000) == 50
    assert resolve_warmup(30, 1000) == 30
    assert resolve_warmup(None, 1000) == 0


def test_unknown_schedule_is_named():
    with pytest.raises(ValueError, match="stage.schedule='linear'"):
        lr_at(0, total=10, lr=1.0, min_lr=0.0, warmup=0, schedule="linear")
    assert math.isfinite(lr_at(5, total=10, lr=1.0, min_lr=0.0, warmup=0, schedule="constant"))
