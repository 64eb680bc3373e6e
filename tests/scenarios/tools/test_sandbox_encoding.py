"""Files written for the sandbox are UTF-8 whatever the host's locale (issue: non-ASCII
submissions raised UnicodeEncodeError out of ``step`` under an ASCII locale)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

# PYTHONUTF8=0 and PYTHONCOERCECLOCALE=0 keep Python from switching the C locale to UTF-8,
# so the preferred encoding is ASCII, as on a host with a non-UTF-8 locale.
ASCII_LOCALE = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}

SCRIPT = r"""
import json, locale
from parley.scenarios.tools.sandbox import Sandbox
from parley.scenarios.code.debug import CodeDebugV0
encoding = locale.getpreferredencoding(False).lower()
assert encoding in ("ascii", "ansi_x3.4-1968"), encoding
code = 'print(len("caf\u00e9 \u2603" + open("data.txt", encoding="utf-8").read()))'
run = Sandbox(allow_weak=True).run(code, files={"data.txt": "\u00e9t\u00e9"})
assert run.ok and run.stdout.strip() == "9", run
env = CodeDebugV0(task=0, allow_weak_sandbox=True)
env.reset(seed=0)
# \u escapes keep the move ASCII on the wire; the submission itself is not ASCII.
env.step({"coder": json.dumps({"submit": "# caf\u00e9\nx = '\u00e9'\n"})})
print("OK", env.case.submitted)
"""


def test_non_ascii_files_under_an_ascii_locale() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=ASCII_LOCALE, capture_output=True, text=True, timeout=50
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "OK True" in out.stdout
