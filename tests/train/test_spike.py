"""infir.train.spike: which gradient norms are spikes (pure bookkeeping; the loop's use is in test_bad_steps.py)."""
import pytest

from infir.train.spike import SpikePolicy


def test_a_norm_above_factor_times_the_running_median_is_a_spike_once_the_window_is_full():
    policy = SpikePolicy("skip", factor=3.0, window=4)
    assert [policy.is_spike(n) for n in (9.0, 1.0, 2.0, 1.0)] == [False] * 4  # filling the window: nothing judged
    assert policy.median() == 1.5
    assert policy.is_spike(4.6) and policy.is_spike(100.0)  # > 3 x 1.5
    assert list(policy.norms) == [9.0, 1.0, 2.0, 1.0], "spikes stay out of the window"
    assert not policy.is_spike(4.5)  # not above: it joins the window, the oldest norm leaves
    assert list(policy.norms) == [1.0, 2.0, 1.0, 4.5] and policy.median() == 1.5


def test_none_judges_nothing_and_the_window_survives_a_checkpoint():
    off = SpikePolicy("none", window=2)
    assert not any(off.is_spike(n) for n in (1.0, 1.0, 1e9)) and off.state_dict() == {"norms": []}
    policy = SpikePolicy("rollback", factor=2.0, window=3)
    for n in (1.0, 2.0, 3.0):
        policy.is_spike(n)
    resumed = SpikePolicy("rollback", factor=2.0, window=3)
    resumed.load_state_dict(policy.state_dict())
    assert resumed.is_spike(4.1) and not resumed.is_spike(4.0)
    resumed.load_state_dict(None)  # a checkpoint saved without the policy: an empty window
    assert not resumed.is_spike(1e9)


def test_an_unknown_action_is_refused():
    with pytest.raises(ValueError, match="expected one of none, skip, rollback"):
        SpikePolicy("restart")
