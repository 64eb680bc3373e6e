"""vLLM's logs stay off stdout, where parley's commands print their results (``--json``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(120)]

_PROBE = """
import parley.arena.inference.backends.vllm  # what every parley command with vLLM loads
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging, init_logger
configure_logging(LoggingConfig())  # as the engine does when it starts
init_logger("vllm.probe").error("probe-%s", "line")
"""


@pytest.mark.parametrize("chosen", [None, "ext://sys.stdout"])
def test_vllm_logs_go_to_stderr_unless_the_user_chose_a_stream(chosen: str | None) -> None:
    # None of vLLM's settings from this process (TRL, once imported, sets VLLM_LOGGING_LEVEL).
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    if chosen:
        env["VLLM_LOGGING_STREAM"] = chosen
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr[-2000:]
    wanted, other = (done.stdout, done.stderr) if chosen else (done.stderr, done.stdout)
    assert "probe-line" in wanted, (done.stdout[-2000:], done.stderr[-2000:])
    assert "probe-line" not in other, (done.stdout[-2000:], done.stderr[-2000:])
