"""What the interop tests share: the external tool each needs, found or reported.

Outside CI a missing tool skips the test with the way to install it; in CI (CI=true)
it fails the test instead, so a broken install can never pass as a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
INSTALL = "deploy/install_test_tools.sh"


def require_tool(found: bool, reason: str) -> None:
    """Skip (outside CI) or fail (CI=true) the test when `found` is false."""
    if found:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must install it ({INSTALL})", pytrace=False)
    pytest.skip(f"{reason} (install with {INSTALL})")
