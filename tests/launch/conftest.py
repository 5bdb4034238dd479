"""Fixtures of the launch/report tests."""
import pytest
from synthetic_runs import make_demo_runs


@pytest.fixture
def demo_runs(tmp_path):
    """Two precisions x (cpt, sft1) + an eval summary each, laid out as launch/pipeline.sh does."""
    return make_demo_runs(tmp_path)
