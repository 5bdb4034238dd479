"""The demo data, built once per test session (or taken from $INFIR_TEST_DEMO_DATA)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory) -> Path:
    from infir.data.demo import ensure_demo_data

    root = Path(os.environ.get("INFIR_TEST_DEMO_DATA", tmp_path_factory.mktemp("demo_data")))
    ensure_demo_data(root, progress=False)
    return root
