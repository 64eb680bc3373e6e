"""Scripted agents for ``code/debug-v0``: an oracle coder, a naive coder and a reviewer.

The oracle is ``privileged``: it reads the reference fix from the scenario's oracle hook
(``info["oracle"]``, given only to in-process agents), and acts through the scenario's tools
like any agent: it runs the visible tests on the fix (or sends it to the reviewer), then
submits it. It solves every task, which proves each
bundled fix passes its hidden tests through the real sandbox path.
"""

from __future__ import annotations

import json
from typing import Any

from parley.agents.scripted.base import ScriptedAgent
from parley.protocols.errors import ConfigError
from parley.protocols.messages import Observation
from parley.scenarios.base import ORACLE_KEY

__all__ = ["DebugNaive", "DebugOracle", "DebugReviewer"]


def _view(observation: Observation) -> dict[str, Any]:
    view = observation.info.get("view", {})
    return view if isinstance(view, dict) else {}


def _run_tests(code: str) -> str:
    return json.dumps({"tool_calls": [{"name": "run_tests", "arguments": {"code": code}}]})


class DebugOracle(ScriptedAgent):
    """Checks the reference fix (tests, or the reviewer), then submits it.

    Privileged: reads the fix from ``info["oracle"]`` (never sent to remote agents).
    """

    name = "debug-oracle"
    privileged = True

    def new_episode(self) -> None:
        self.moves = 0

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        oracle = observation.info.get(ORACLE_KEY)
        if not isinstance(oracle, dict) or not isinstance(oracle.get("fixed"), str):
            raise ConfigError(
                "DebugOracle needs the scenario's privileged oracle data; the runner gives it "
                "only to in-process agents (it cannot play a remote seat)"
            )
        fixed = oracle["fixed"]
        self.moves += 1
        if self.moves == 1:
            if view.get("reviewer"):
                return json.dumps({"message": "Here is my fix:\n" + fixed})
            return _run_tests(fixed)
        return json.dumps({"submit": fixed})


class DebugNaive(ScriptedAgent):
    """Submits the module unchanged: scores only the hidden tests the bug does not break."""

    name = "debug-naive"

    def decide(self, observation: Observation) -> str:
        return json.dumps({"submit": str(_view(observation).get("code", ""))})


class DebugReviewer(ScriptedAgent):
    """Runs the visible tests on the coder's latest draft and reports the summary line."""

    name = "debug-reviewer"

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        results = view.get("tool_results", [])
        if results:
            report = str(results[-1].get("content") or results[-1].get("error", ""))
            return json.dumps({"comment": "Test run: " + report.splitlines()[0]})
        draft = str(view.get("last_message", ""))
        code = draft[draft.find("def ") :] if "def " in draft else str(view.get("code", ""))
        return _run_tests(code)
