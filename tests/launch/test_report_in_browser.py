"""The compare report as a reader sees it: rendered by headless Chromium, every plot loaded and painted.

Needs Debian's `chromium` (apt-get install -y chromium). Without it the test is skipped, except where
CI=1 or INFIR_REQUIRE_BROWSER=1 make a missing browser a failure. INFIR_SCREENSHOT_DIR keeps the
screenshot for a person to look at.
"""
import os
import re
import shutil
import subprocess

import matplotlib.image
import numpy as np
import pytest

from infir.report.compare import main

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# matplotlib's C0 and C1: the bf16 and fp8 series; nothing else on the page has these colours
SERIES_RGB = {"bf16 blue": (31, 119, 180), "fp8 orange": (255, 127, 14)}


def browser() -> str:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        message = "no headless Chromium: apt-get update && apt-get install -y chromium"
        if os.environ.get("CI") or os.environ.get("INFIR_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def headless(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_renders_its_plots_in_headless_chromium(demo_runs, tmp_path):
    out = tmp_path / "report"
    assert main([str(demo_runs), "--out", str(out)]) == 0
    page = f"file://{out / 'index.html'}"
    n_plots = len(list((out / "plots").glob("*.png")))

    dom = headless("--virtual-time-budget=5000", "--dump-dom", page).stdout
    assert re.search(r'data-plots-loaded="(\d+)"', dom).group(1) == str(n_plots)  # set by the page once loaded

    shot = tmp_path / "report.png"
    done = headless("--window-size=1300,4600", f"--screenshot={shot}", page)
    assert shot.is_file(), done.stderr
    if os.environ.get("INFIR_SCREENSHOT_DIR"):
        shutil.copy(shot, os.environ["INFIR_SCREENSHOT_DIR"])
    pixels = (matplotlib.image.imread(shot)[..., :3] * 255).round().astype(int)
    assert pixels.shape[:2] == (4600, 1300)
    for name, rgb in SERIES_RGB.items():
        painted = np.all(np.abs(pixels - np.array(rgb)) <= 3, axis=-1).sum()
        assert painted > 20_000, f"{name}: only {painted} pixels of the series colour on screen: plots not rendered"

    # the same page without its plots/ folder: the reader is told, not shown empty frames
    shutil.rmtree(out / "plots")
    dom = headless("--virtual-time-budget=5000", "--dump-dom", page).stdout
    assert 'data-plots-loaded="0"' in dom and f"{n_plots} plot(s) failed to load" in dom
