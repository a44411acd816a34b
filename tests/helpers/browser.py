"""A real browser for the dashboard's tests: Debian's Chromium driven by Playwright (the ``test``
extra installs Playwright; Chromium comes from Debian, never from a download at run time).

:func:`chromium` finds ``chromium`` on the PATH and, when it is missing on a machine where the
tests run as root with apt (CI), installs Debian's package once. Elsewhere it fails saying how to
install it; ``EVOLVE_SKIP_BROWSER=1`` skips the browser tests instead, on purpose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# As the machine's probe starts it: no sandbox as root, no GPU, and nothing that calls home
# (this machine's closed network refuses those connections, many at a time).
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
ROOT = Path(__file__).resolve().parents[2]


def artifacts() -> Path:
    """Where the browser tests keep their screenshots (``EVOLVE_TEST_ARTIFACTS``, else ./test-artifacts)."""
    out = Path(os.environ.get("EVOLVE_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "ui"
    out.mkdir(parents=True, exist_ok=True)
    return out


def chromium() -> str:
    if os.environ.get("EVOLVE_SKIP_BROWSER") == "1":
        pytest.skip("EVOLVE_SKIP_BROWSER=1: the browser tests were skipped on purpose")
    found = shutil.which("chromium")
    if found:
        return found
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
        if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            subprocess.run(cmd, env=env, capture_output=True)
        found = shutil.which("chromium")
        if found:
            return found
    pytest.fail(
        "the dashboard's browser tests need Chromium: install Debian's package (apt-get install chromium) "
        "or set EVOLVE_SKIP_BROWSER=1 to skip them"
    )


def launch(playwright):
    return playwright.chromium.launch(executable_path=chromium(), args=ARGS)
