"""Headless Chromium for the viewer's browser tests (Debian's ``chromium``, driven by
Playwright), and a server running in a thread so that the sync Playwright API can use it.

Without a browser the tests skip with one line; with ``CI=true`` a missing browser fails.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[3] / ".artifacts" / "view"
"""Screenshots of each page (gitignored)."""


def find_chromium() -> str | None:
    """The chromium executable, or None when it or Playwright is missing."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return None
    return path


MISSING = "browser tests need chromium and playwright: make browser (apt-get install chromium)"


def skip_unless_ci() -> None:
    """Without a browser: skip the module in one line, except in CI (``CI=true``), where
    each browser test fails (a collection error would stop the whole suite)."""
    if find_chromium() is None and os.environ.get("CI", "").lower() != "true":
        pytest.skip(MISSING, allow_module_level=True)


class LoopThread:
    """An asyncio loop in a thread: start servers and runs there, call from the test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, make: Callable[[], Awaitable[Any]], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(_await(make), self.loop).result(timeout)

    def submit(self, make: Callable[[], Awaitable[Any]]) -> Any:
        return asyncio.run_coroutine_threadsafe(_await(make), self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def _await(make: Callable[[], Awaitable[Any]]) -> Any:
    return await make()
