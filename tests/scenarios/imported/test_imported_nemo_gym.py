"""NeMo Gym's resources servers as parley scenarios (parley.scenarios.imported.nemo_gym).

The real part: NeMo Gym's own ``example_multi_step`` server (its code, unchanged, started by
:mod:`parley.arena.integrations.nemo_gym_resources` under the Python of an environment with
nemo-gym installed; the tests skip where there is none, and are ``long``: that environment is
built for the long tests, ``make install-nemo-gym``). The hostile-server tests need a
server that stalls, dies or floods, which NeMo Gym's servers do not do on request: a small
stdlib HTTP server on a real loopback socket plays those parts.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parley.arena.integrations.nemo_gym_resources import (
    NemoGymUnavailable,
    ResourcesServer,
    nemo_gym_python,
    resources_server,
)
from parley.arena.run.config import RunConfig
from parley.arena.run.runner import run
from parley.protocols.errors import ConfigError
from parley.scenarios import make
from parley.scenarios.conformance import check_scenario
from parley.scenarios.imported.nemo_gym import NemoGymServerError

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def _started(name: str) -> Iterator[ResourcesServer]:
    """NeMo Gym's server ``name``; the test skips where NeMo Gym's environment is missing."""
    try:
        with resources_server(name) as server:
            yield server
    except NemoGymUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def served() -> Iterator[ResourcesServer]:
    with _started("example_multi_step") as server:
        yield server


def _solve(env: Any, values: list[int] | None = None) -> dict[str, str]:
    """The solver looks up the row's synonyms and reports ``values`` (default: right)."""
    row = env.oracle("solver")
    calls = [
        {"name": "get_synonym_value", "arguments": {"synonym": word}}
        for word in row["expected_synonyms"]
    ]
    env.step({"solver": json.dumps({"tool_calls": calls})})
    report = row["expected_synonym_values"] if values is None else values
    extract = {"name": "extract_synonym_values", "arguments": {"synonym_values": report}}
    observations, *_ = env.step({"solver": json.dumps({"tool_calls": [extract], "submit": True})})
    return dict(observations)


@pytest.mark.long
def test_nemo_gyms_verify_scores_both_seats(served: ResourcesServer) -> None:
    env = make(served.id)
    observations, _ = env.reset(seed=4)
    assert "extract_synonym_values(synonym_values: list[integer])" in observations["solver"]
    observations = _solve(env)
    assert "solver called [call_4] extract_synonym_values" in observations["checker"]
    _, rewards, done, _, infos = env.step({"checker": '{"verdict": "accept"}'})
    assert all(done.values())
    assert infos["solver"]["components"] == {"task": 1.0}
    assert infos["checker"]["components"] == {"task": 1.0, "verdict": 0.5}
    assert rewards == {"solver": 1.0, "checker": 1.5}
    metrics = env.episode_metrics()
    assert metrics["verify_accuracy"] == 1.0
    assert metrics["tool_calls"] == 3.0

    env.reset(seed=4)  # wrong values, accepted: NeMo Gym scores 0, the checker pays
    _solve(env, values=[1, 2])
    _, rewards, *_ = env.step({"checker": '{"verdict": "accept"}'})
    assert rewards == {"solver": 0.0, "checker": -0.5}


@pytest.mark.long
def test_a_rejection_hands_back_and_the_checker_can_correct(served: ResourcesServer) -> None:
    env = make(served.id, solver_turns=3)
    env.reset(seed=1)
    right = env.oracle("checker")["expected_synonym_values"]
    _solve(env, values=right[::-1])  # the right values in the wrong order
    observations, *_ = env.step({"checker": '{"verdict": "reject", "message": "order!"}'})
    assert "checker (private to solver): order!" in observations["solver"]
    assert "rejected" in observations["solver"]
    env.step({"solver": '{"submit": true}'})  # the solver's last turn: unchanged
    fix = {"name": "extract_synonym_values", "arguments": {"synonym_values": right}}
    env.step({"checker": json.dumps({"tool_calls": [fix]})})
    _, rewards, done, _, _ = env.step({"checker": '{"verdict": "accept"}'})
    assert all(done.values())
    assert rewards["solver"] == 1.0
    assert env.episode_metrics()["rejections"] == 1.0


@pytest.mark.long
def test_bad_tool_calls_are_invalid_moves_and_never_reach_the_server(
    served: ResourcesServer,
) -> None:
    env = make(served.id)
    env.reset(seed=0)
    huge = "x" * 5000  # over the action limit: refused whole
    bad_type = {"name": "get_synonym_value", "arguments": {"synonym": 7}}
    unknown = {"name": "verify", "arguments": {}}  # a NeMo Gym route that is not a tool
    moves = [
        json.dumps({"tool_calls": [{"name": "get_synonym_value", "arguments": {"x": huge}}]}),
        json.dumps({"tool_calls": [bad_type]}),
        json.dumps({"tool_calls": [unknown]}),
        '{"tool_calls": [{"name": "get_synonym_value", "arguments": "{not json"}]}',
        '{"tool_calls": "all of them"}',
    ]
    reasons = []
    for move in moves:
        *_, infos = env.step({"solver": move})
        reasons.append(infos["solver"].get("invalid", ""))
    assert "characters" in reasons[0]
    assert "must be string" in reasons[1]
    assert "unknown tool 'verify'" in reasons[2]
    assert "not JSON" in reasons[3]
    assert "must be a list" in reasons[4]
    assert env.s.output == []  # nothing was sent: the response holds what the server saw
    assert env.s.phase == "solver"
    assert env.s.turns_left["solver"] == 1


@pytest.mark.long
@pytest.mark.timeout(300)
def test_the_scenario_passes_the_conformance_suite(served: ResourcesServer) -> None:
    report = check_scenario(served.id)
    assert all(r == "passed" or r.startswith("n/a") for r in report.values()), report


@pytest.mark.long
@pytest.mark.timeout(300)
def test_a_stateful_server_workplace_assistant_plays_the_same_way() -> None:
    """NeMo Gym's workplace_assistant keeps each session's own email/calendar/CRM data: the
    reference calls, made by both seats, score 1; nothing done scores 0.
    (The conformance suite passes over it too, in 83 s here: 27 tools of hostile input; the
    suite runs over example_multi_step above.)"""
    with _started("workplace_assistant") as served:
        env = make(served.id)
        env.reset(seed=0)
        calls = [
            {"name": call["name"], "arguments": json.loads(call["arguments"])}
            for call in env.oracle("solver")["ground_truth"]
        ]
        half = len(calls) // 2
        env.step({"solver": json.dumps({"tool_calls": calls[:half], "submit": True})})
        env.step({"checker": json.dumps({"tool_calls": calls[half:]})})
        _, rewards, *_ = env.step({"checker": '{"verdict": "accept"}'})
        assert rewards == {"solver": 1.0, "checker": 1.5}
        env.reset(seed=0)  # the same task, nothing done, accepted: 0, and the checker pays
        env.step({"solver": '{"submit": true}'})
        _, rewards, *_ = env.step({"checker": '{"verdict": "accept"}'})
        assert rewards == {"solver": 0.0, "checker": -0.5}


def test_the_scenario_needs_a_server_address() -> None:
    with pytest.raises(ConfigError, match="nemo_gym_resources example_multi_step"):
        make("nemogym:example_multi_step")
    with pytest.raises(ConfigError, match="resources server name"):
        make("nemogym:../etc@127.0.0.1:1")


# -- hostile servers ------------------------------------------------------------------------

ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "Call ping."}],
        "tools": [{"type": "function", "name": "ping", "parameters": {"type": "object"}}],
    },
}


class _Hostile(http.server.BaseHTTPRequestHandler):
    """Serves the rows and /seed_session; ``/ping`` does what ``server.mode`` says."""

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "session=abc; HttpOnly")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(json.dumps(ROW).encode() + b"\n")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = getattr(self.server, "mode", "")
        if self.path != "/ping":
            self._send(b"{}")
        elif mode == "stall":
            self.server.release.wait(30)  # type: ignore[attr-defined]
        elif mode == "flood":
            self._send(b"[" + b"0," * 1_000_000 + b"0]")
        elif mode == "hang_up":
            self.close_connection = True  # no answer at all
        else:
            self._send(b'{"error": "no"}', status=422)


@pytest.fixture
def hostile() -> Iterator[Any]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.release = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()


PING = '{"tool_calls": [{"name": "ping", "arguments": {}}]}'


@pytest.mark.parametrize("mode", ["stall", "flood", "hang_up"])
def test_a_failing_server_fails_the_episode_instead_of_hanging(hostile: Any, mode: str) -> None:
    env = make(f"nemogym:ping@127.0.0.1:{hostile.server_port}", call_timeout=1.0)
    env.reset(seed=0)
    hostile.mode = mode
    with pytest.raises(NemoGymServerError, match="/ping"):
        env.step({"solver": PING})


def test_an_http_error_is_the_calls_result_and_a_dead_server_the_episodes(hostile: Any) -> None:
    env = make(f"nemogym:ping@127.0.0.1:{hostile.server_port}", call_timeout=1.0)
    observations, _ = env.reset(seed=0)
    assert "Call ping." in observations["solver"]
    observations, *_, infos = env.step({"solver": PING})
    assert '-> ERROR: HTTP 422: {"error": "no"}' in observations["solver"]
    assert "invalid" not in infos["solver"]  # the server refused: the model's lesson, no penalty
    assert env.s.cookies == {"session": "abc"}
    hostile.shutdown()
    hostile.server_close()
    with pytest.raises(NemoGymServerError, match="check that it runs"):
        env.step({"solver": PING})


def test_parley_run_records_an_unscorable_episode_as_failed_not_zero(hostile: Any) -> None:
    """The stand-in's ``/verify`` answers ``{}`` (no reward): each episode fails with the
    reason, none is scored (the baselines submit at once and the checker gives a verdict)."""
    scenario = f"nemogym:ping@127.0.0.1:{hostile.server_port}"
    config = RunConfig(scenario=scenario, episodes=2, progress=False)
    result = run(config, keep_records=True)
    assert result.summary["episodes"] == {"total": 2, "ok": 0, "failed": 2}
    for record in result.records:
        assert "scenario_error" in record.failed
        assert "/verify answered no numeric reward" in record.failed


# -- NeMo Gym's own launcher ----------------------------------------------------------------

NG_CONFIG = """head_server:
  host: 127.0.0.1
  port: {head}
example_multi_step_resources_server:
  resources_servers:
    example_multi_step:
      entrypoint: app.py
      domain: instruction_following
      verified: false
      host: 127.0.0.1
      port: {port}
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.long
@pytest.mark.timeout(300)
def test_a_server_started_by_ng_run_plays_as_a_scenario(tmp_path: Path) -> None:
    """``ng_run`` itself starts the server (a Ray cluster, its head server, the resources
    server in its own process): no ``uv`` or network, because ``+skip_venv_if_present`` finds
    the server's environment already there (a link to NeMo Gym's)."""
    python = nemo_gym_python()
    if not python.exists():
        pytest.skip(f"no {python}: nemo-gym's environment is not built here")
    venv = tmp_path / "venvs" / "resources_servers" / "example_multi_step" / ".venv"
    venv.parent.mkdir(parents=True)
    venv.symlink_to(python.parent.parent)
    port, head = _free_port(), _free_port()  # (ng_run's head server defaults to 11000)
    config = tmp_path / "rs.yaml"
    config.write_text(NG_CONFIG.format(port=port, head=head))
    log = (tmp_path / "ng_run.log").open("w+")
    cmd = [str(python.parent / "ng_run"), "--config", str(config)]
    cmd += ["+skip_venv_if_present=true", f"+uv_venv_dir={tmp_path / 'venvs'}"]
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True
    )
    try:
        while "All 1 / 1 servers ready" not in (tmp_path / "ng_run.log").read_text():
            assert proc.poll() is None, (tmp_path / "ng_run.log").read_text()[-3000:]
            time.sleep(1)  # progress is judged by ng_run's own log; the test timeout bounds it
        rows = python.parent.parent.glob("lib/python*/site-packages/resources_servers/")
        (folder,) = list(rows)
        env = make(
            f"nemogym:example_multi_step@127.0.0.1:{port}",
            rows=str(folder / "example_multi_step" / "data" / "example.jsonl"),
        )
        env.reset(seed=2)
        _solve(env)
        _, rewards, *_ = env.step({"checker": '{"verdict": "accept"}'})
        assert rewards == {"solver": 1.0, "checker": 1.5}
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # ng_run shuts its Ray cluster down on SIGINT
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()
