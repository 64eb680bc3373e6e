"""nemogym:SERVER — a NeMo Gym resources server played by two seats, a solver and a checker.

NeMo Gym's resources servers are single-agent: its ``simple_agent`` posts a dataset row to
``/seed_session``, each of the model's function calls to ``/{tool name}`` (the arguments as
the JSON body; the server's session cookie carried along), and finally the row plus the whole
Responses-API ``response`` (function calls, their outputs, assistant messages) to ``/verify``,
which answers a ``reward``. This adapter plays one such session per episode with two seats
sharing it, so a NeMo Gym environment becomes a multi-agent one:

- ``solver`` reads the task (the row's ``responses_create_params.input``: system and user
  messages) and calls the server's tools (the row's ``tools``), over as many turns as it
  needs (at most ``solver_turns``), then hands over with ``"submit": true``;
- ``checker`` sees everything the solver did (calls, results, answers: the session is
  shared), may call the tools itself (its calls go into the same response, so it can correct
  the work), and gives a ``verdict``: ``accept`` ends the episode, ``reject`` (with a
  ``message`` saying why) hands back to the solver while it has turns left. A checker out of
  its ``checker_turns`` without a verdict ends the episode with none.

At the end, the transcript of both seats goes to ``/verify`` as one response.

Action (the tool-use syntax of :mod:`parley.scenarios.tools.tool`), one JSON object a turn::

    solver:  {"tool_calls": [{"name": "get_synonym_value", "arguments": {"synonym": "Warm"}}],
              "answer": "text for the response", "message": "to the checker", "submit": true}
    checker: {"tool_calls": [...], "verdict": "accept" | "reject", "message": "why"}

every key optional. Tool calls run first (at most 4 a turn), in order, on the server; their
results arrive in both seats' next observations. ``answer`` (at most 2,000 characters)
becomes an assistant message of the response (servers that score text read it), ``message``
(at most 300) goes to the other seat. Unknown keys, wrong types, an unknown tool or arguments
that do not match its schema are invalid moves (the turn is used; a bad call is never sent
and not in the response, since the response holds what the server saw; the rest of the move
still applies). A move the
action space refuses uses the turn too.

Rewards (on the last step; ``r`` is ``/verify``'s reward):

==========  =================================================================================
component   value
==========  =================================================================================
task        ``r``, for both seats (one response was scored)
verdict     checker only: ``verdict_weight`` (0.5) x (2r - 1) for a last verdict ``accept``,
            x (1 - 2r) for ``reject`` (accepting good work and rejecting bad both pay), 0 for
            none
invalid     -``invalid_penalty`` (0.05) per invalid move
==========  =================================================================================

Metrics: ``reward`` (r), ``success`` (r >= 1), ``accepted``, ``rejections``, ``tool_calls``,
and every number or boolean of ``/verify``'s answer that is not part of the request, as
``verify_<field>`` (``verify_accuracy``, ``verify_set_overlap`` for ``example_multi_step``).

Observations show the task, the tool list, every tool call of either seat with its result
(cut to 2,000 characters), answers, messages and hand-overs. ``infos[seat]["view"]``:
``server``, ``phase``, ``turns_left``, ``tools`` (OpenAI function specs), ``tool_results``
(this seat's last results), ``legal`` (a few moves that are always legal, which the scripted
baselines play). The row's other fields (the reference answers) never reach ``infos``;
:meth:`NemoGymTools.oracle` gives them to in-process oracles.

Failures: the server is outside parley, so its failure is the episode's, never a score. A
server that refuses the connection, stalls past ``call_timeout`` seconds on any request, or
answers more than ``max_reply_bytes`` raises :class:`NemoGymServerError` out of ``reset`` or
``step`` (the runner records the episode as failed with the reason); an HTTP error answer to a
tool call is the server refusing that call: the call's result is the error, as NeMo Gym's own
agent passes it to the model.

Arguments: ``server`` (the resources server's name) and ``address`` (``HOST:PORT``), both
from the id ``nemogym:SERVER@HOST:PORT``; ``server_url`` (``http://HOST:PORT``, instead of an
address in the id); start a server with :mod:`parley.arena.integrations.nemo_gym_resources`,
which prints the id. ``rows`` (a JSONL file of NeMo Gym rows; default: the rows that launcher
serves at ``GET /parley/rows``, the server's ``data/example.jsonl``; each episode plays a row
drawn from ``reset(seed=...)``), ``solver_turns`` (6),
``checker_turns`` (3), ``verdict_weight`` (0.5), ``call_timeout`` (10.0),
``max_reply_bytes`` (1,000,000), ``invalid_penalty``, ``max_cycles``, ``render_mode``.

    >>> env = make("nemogym:example_multi_step@127.0.0.1:8000")

Version history: first version (an imported game's id carries no version; a change of these
rules would be a new prefix).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import msgspec
import numpy as np

from parley.protocols.errors import ConfigError
from parley.protocols.messages import ToolResult
from parley.scenarios.base import Scenario
from parley.scenarios.imported import Entry
from parley.scenarios.imported.nemo_gym_http import (
    MAX_ROWS_BYTES,
    ROWS_PATH,
    NemoGymServerError,
    load_rows,
    parse_rows,
    request,
    response_object,
)
from parley.scenarios.registry import ScenarioSpec
from parley.scenarios.tools.tool import (
    Tool,
    ToolBox,
    ToolFailure,
    action_constraint,
    parse_turn,
    render_result,
    result_dicts,
)

__all__ = ["SEATS", "NemoGymServerError", "NemoGymTools", "catalog", "response_object", "spec_for"]

SEATS = ("solver", "checker")
SERVERS: dict[str, str] = {
    "example_multi_step": "look up synonym values with a tool, report the relevant ones "
    "in order with another (scored on the exact list)",
    "workplace_assistant": "27 tools over a session's own email, calendar, analytics, "
    "project and CRM data (scored on the state the calls leave, against reference calls)",
}
"""NeMo Gym servers this adapter was played against here (any server of NeMo Gym's
``simple_agent`` protocol whose tools need no outside service plays the same way)."""
_BASELINE = "parley.agents.scripted.imported:RandomLegal"
MAX_ANSWER_CHARS = 2000
MAX_MESSAGE_CHARS = 300
_SHOWN = 2000  # characters of a tool result in an observation
_FINALS: dict[str, dict[str, Any]] = {
    "solver": {"answer": {"type": "string"}, "message": {"type": "string"},
               "submit": {"type": "boolean"}},
    "checker": {"verdict": {"enum": ["accept", "reject"]}, "message": {"type": "string"}},
}  # fmt: skip
_LEGAL = {
    "solver": ['{"submit": true}'],
    "checker": ['{"verdict": "accept"}', '{"verdict": "reject", "message": "Check again."}'],
}


def spec_for(name: str) -> ScenarioSpec:
    """The spec of ``nemogym:SERVER`` (``server_url=`` given to ``make``) or
    ``nemogym:SERVER@HOST:PORT`` (the server's address in the id)."""
    server, _, address = name.partition("@")
    if not server.isidentifier():
        raise ConfigError(f"{server!r} is not a NeMo Gym resources server name (a folder name)")
    kwargs: dict[str, Any] = {"server": server}
    if address:
        kwargs["address"] = address
    return ScenarioSpec(
        f"nemogym:{name}",
        "parley.scenarios.imported.nemo_gym:NemoGymTools",
        kwargs=kwargs,
        baselines=dict.fromkeys(SEATS, _BASELINE),
        description=f"NeMo Gym's {name} resources server: a solver and a checker share one "
        "session; /verify's reward for both",
    )


def catalog() -> list[Entry]:
    """The servers played here (see :data:`SERVERS`)."""
    where = "; play it running: nemogym:{}@HOST:PORT (python -m parley.arena.integrations."
    where += "nemo_gym_resources {})"
    return [
        Entry(f"nemogym:{name}", SEATS, text + where.format(name, name))
        for name, text in sorted(SERVERS.items())
    ]


def _toolbox(row: Mapping[str, Any], call: Any) -> ToolBox:
    """The row's function tools, each posting to the server through ``call(name, args)``."""
    tools = []
    for spec in row["responses_create_params"].get("tools") or []:
        if not isinstance(spec, dict) or spec.get("type") != "function":
            continue
        name = str(spec["name"])
        text = str(spec.get("description") or "").split("\n", 1)[0]
        params = spec.get("parameters") or {"type": "object", "properties": {}}
        tools.append(Tool(name, text, params, _posting(call, name)))
    return ToolBox(tools)


def _posting(call: Any, name: str) -> Any:
    """``fn(**arguments)`` for :class:`Tool` (a closure: any argument name is the tool's)."""
    return lambda **arguments: call(name, arguments)


@dataclasses.dataclass
class NemoGymState:
    row_index: int
    cookies: dict[str, str]
    phase: str
    """The seat to act ("solver", "checker") or "done"."""
    turns_left: dict[str, int]
    output: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The response's output items so far (both seats' calls, outputs, answers)."""
    verdict: str = ""
    rejections: int = 0
    tool_calls: int = 0
    last_results: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    reward: float | None = None
    verified: dict[str, float] = dataclasses.field(default_factory=dict)


class NemoGymTools(Scenario):
    """A NeMo Gym resources server, solver and checker; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "nemogym:*",
        "render_modes": ["ansi", "human"],
        "is_parallelizable": True,
        "blocking_step": True,  # each step waits on HTTP answers (bounded by call_timeout)
    }
    default_invalid_penalty = 0.05
    refused_move_takes_turn: ClassVar[bool] = True
    max_action_length: ClassVar[int] = 4000
    max_observation_length: ClassVar[int] = 16384  # NeMo Gym tasks run to ~9,000 characters
    s: NemoGymState

    def __init__(
        self,
        server: str,
        server_url: str | None = None,
        address: str | None = None,
        rows: str | None = None,
        solver_turns: int = 6,
        checker_turns: int = 3,
        verdict_weight: float = 0.5,
        call_timeout: float = 10.0,
        max_reply_bytes: int = 1_000_000,
        *,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        # The id names the server (and where it runs), so the name is the instance's.
        name = f"nemogym:{server}@{address}" if address else f"nemogym:{server}"
        self.metadata = {**type(self).metadata, "name": name}  # type: ignore[misc]
        server_url = server_url or (f"http://{address}" if address else None)
        super().__init__(
            list(SEATS), render_mode=render_mode, max_cycles=max_cycles,
            invalid_penalty=invalid_penalty,
        )  # fmt: skip
        if not server_url:
            raise ConfigError(
                f"nemogym:{server} needs the server's address: start it with `python -m "
                f"parley.arena.integrations.nemo_gym_resources {server}`, which prints the id "
                f"to play (nemogym:{server}@HOST:PORT)"
            )
        parts = urlsplit(server_url)
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
            raise ConfigError(f"server_url must be http://HOST:PORT, got {server_url!r}")
        if solver_turns < 1 or checker_turns < 1 or call_timeout <= 0 or max_reply_bytes < 1:
            raise ConfigError("solver_turns, checker_turns, call_timeout, max_reply_bytes > 0")
        self.server = server
        self.host, self.port = parts.hostname, parts.port or 80
        self.call_timeout, self.max_reply_bytes = call_timeout, max_reply_bytes
        self.rows = load_rows(rows) if rows else self._served_rows()
        self.solver_turns, self.checker_turns = solver_turns, checker_turns
        self.verdict_weight = verdict_weight
        self._failure: NemoGymServerError | None = None
        self._tools = _toolbox(self.rows[0], self._call)  # (system prompts precede reset)

    # -- the server ----------------------------------------------------------------------

    def _post(self, path: str, body: Any) -> tuple[int, str]:
        """POST ``body`` as JSON with the session's cookies: :func:`request`."""
        address = (self.host, self.port)
        limits = (self.call_timeout, self.max_reply_bytes)
        return request(address, "POST", path, body, self.s.cookies, *limits)

    def _served_rows(self) -> list[dict[str, Any]]:
        """The rows parley's launcher serves beside NeMo Gym's routes (``GET /parley/rows``)."""
        address, limit = (self.host, self.port), MAX_ROWS_BYTES
        status, text = request(address, "GET", ROWS_PATH, None, {}, self.call_timeout, limit)
        if status != 200:
            raise ConfigError(
                f"{self.host}:{self.port}{ROWS_PATH} answered HTTP {status}: a server not "
                "started by parley.arena.integrations.nemo_gym_resources needs rows=FILE.jsonl"
            )
        return parse_rows(text, f"{self.host}:{self.port}{ROWS_PATH}")

    def _post_json(self, path: str, body: Any) -> dict[str, Any]:
        status, text = self._post(path, body)
        try:
            value = json.loads(text) if status == 200 else None
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise NemoGymServerError(f"{path} answered HTTP {status}: {text[:500]}")
        return value

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        """One tool call on the server (ToolBox has checked the arguments against the
        schema); an HTTP error answer is the call's error, a transport failure the episode's."""
        try:
            status, text = self._post("/" + quote(name), arguments)
        except NemoGymServerError as exc:
            self._failure = exc
            raise
        if status != 200:
            raise ToolFailure(f"HTTP {status}: {text[:_SHOWN]}")
        return text

    # -- the episode ---------------------------------------------------------------------

    def new_episode(self, rng: np.random.Generator) -> None:
        index = int(rng.integers(len(self.rows)))
        turns = {"solver": self.solver_turns, "checker": self.checker_turns}
        self.s = NemoGymState(index, {}, "solver", turns)
        self._tools = _toolbox(self.row, self._call)
        self._constraints = {
            seat: action_constraint(self._tools, finals) for seat, finals in _FINALS.items()
        }
        self._post_json("/seed_session", self.row)

    @property
    def row(self) -> dict[str, Any]:
        return self.rows[self.s.row_index]

    def brief(self) -> None:
        task = self.row["responses_create_params"]["input"]
        lines = [task] if isinstance(task, str) else [_message_text(m) for m in task]
        text = "\n".join(lines)
        for seat in SEATS:
            self.tell(seat, f"Task:\n{text}\nTools:\n{self._tools.describe()}")

    def acting(self) -> list[str]:
        return [self.s.phase] if self.s.phase in SEATS else []

    def play(self, agent: str, action: str) -> str | None:
        self.s.turns_left[agent] -= 1
        self.s.last_results[agent] = []
        reason = self._apply(agent, action)
        self._hand_over(agent)
        return reason

    def _apply(self, agent: str, action: str) -> str | None:
        parsed = parse_turn(action, turn=self.turn, max_calls=4)
        if isinstance(parsed, str):
            return parsed
        fields, finals = parsed.fields, _FINALS[agent]
        unknown = sorted(set(fields) - set(finals))
        if unknown:
            return f"unknown keys {unknown}; use tool_calls, {', '.join(finals)}"
        for key, value in fields.items():
            if key == "verdict" and value not in ("accept", "reject"):
                return '"verdict" must be "accept" or "reject"'
            kind = {"string": str, "boolean": bool}.get(finals[key].get("type", ""), str)
            if not isinstance(value, kind):
                return f'"{key}" must be a {finals[key].get("type", "string")}'
        limits = {"answer": MAX_ANSWER_CHARS, "message": MAX_MESSAGE_CHARS}
        for key, limit in limits.items():
            if len(fields.get(key, "")) > limit:
                return f'"{key}" has {len(fields[key])} characters; at most {limit}'
        refused = self._run_calls(agent, parsed.calls)
        other = SEATS[1 - SEATS.index(agent)]
        if "answer" in fields:
            self._add_answer(fields["answer"])
            self.announce(f"{agent} answers: {fields['answer']}")
        if fields.get("message"):
            self.say(agent, fields["message"], to=[other])
        if fields.get("submit"):
            self.s.phase = "checker"
        if "verdict" in fields:
            self.s.verdict = fields["verdict"]
            self.s.phase = "done" if fields["verdict"] == "accept" else "solver"
            self.s.rejections += fields["verdict"] == "reject"
        return refused

    def _run_calls(self, agent: str, calls: list[Any]) -> str | None:
        """Run ``calls`` in order; each sent call goes into the response with its output (an
        HTTP error answer as the server sent it, as NeMo Gym's agent passes it). The reason
        of the first call parley refused (never sent, not in the response), else None."""
        results: list[ToolResult] = []
        refused = None
        for call in calls:
            call = msgspec.structs.replace(call, call_id=f"call_{len(self.s.output)}")
            result = self._tools.call(call)
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise failure
            results.append(result)
            if result.error and not result.error.startswith("HTTP "):
                # Refused by parley, never sent: the response holds what the server saw
                # (a verify reading the last call's arguments would fail on these).
                refused = refused or f"tool call {call.name!r} refused: {result.error}"
                continue
            self.s.output.append({
                "type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments, "id": f"fc_{call.call_id}", "status": "completed",
            })  # fmt: skip
            output = result.content if not result.error else result.error.split(": ", 1)[1]
            self.s.output.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": output}
            )
        self.s.tool_calls += len(results)
        self.s.last_results[agent] = result_dicts(results)
        other = SEATS[1 - SEATS.index(agent)]
        for result in results:
            line = _shown(result)
            self.tell(agent, line)
            self.tell(other, f"{agent} called {line}")
        return refused

    def _add_answer(self, text: str) -> None:
        self.s.output.append({
            "type": "message", "role": "assistant", "id": f"msg_{len(self.s.output)}",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        })  # fmt: skip

    def _hand_over(self, agent: str) -> None:
        s = self.s
        if s.phase == "solver" and s.turns_left["solver"] == 0:
            s.phase = "checker"  # out of turns: the work is submitted as it is
        if s.phase == "checker" and agent == "solver":
            s.turns_left["checker"] = self.checker_turns
            self.tell("checker", "The solver submitted its work: review it, then give a verdict.")
        elif s.phase == "solver" and agent == "checker":
            if s.turns_left["solver"] == 0:
                s.phase = "done"
            else:
                self.tell("solver", "The checker rejected the work: continue, then submit.")
        elif s.phase == "checker" and s.turns_left["checker"] == 0:
            s.phase = "done"

    def resolve(self) -> None:
        if self.s.phase == "done":
            self._verify()

    def _verify(self) -> None:
        s = self.s
        body = {**self.row, "response": response_object(self.row, s.output)}
        answer = self._post_json("/verify", body)
        reward = answer.get("reward")
        if not isinstance(reward, int | float) or isinstance(reward, bool):
            raise NemoGymServerError(f"/verify answered no numeric reward: {reward!r}")
        if not math.isfinite(reward):
            raise NemoGymServerError(f"/verify answered a reward that is not finite: {reward}")
        s.reward = r = float(reward)
        s.verified = {
            f"verify_{key}": float(value)
            for key, value in answer.items()
            if key not in body and key != "reward" and type(value) in (bool, int, float)
        }
        sign = {"accept": 2 * r - 1, "reject": 1 - 2 * r}.get(s.verdict, 0.0)
        for seat in SEATS:
            self.reward(seat, "task", r)
        self.reward("checker", "verdict", self.verdict_weight * sign)
        self.announce(f"NeMo Gym's /verify: reward {r:g}.")
        self.finish()

    # -- what seats see -------------------------------------------------------------------

    def prompt(self, agent: str) -> str:
        keys = "tool_calls, answer, message and/or submit"
        if agent == "checker":
            keys = 'tool_calls, message and/or verdict ("accept" or "reject")'
        return f"Your move ({self.s.turns_left[agent]} turns left): a JSON object with {keys}."

    def constraint(self, agent: str) -> dict[str, Any] | None:
        return dict(self._constraints[agent])

    def view(self, agent: str) -> dict[str, Any]:
        s = self.s
        return {
            "server": self.server,
            "phase": s.phase,
            "turns_left": s.turns_left[agent],
            "tools": self._tools.specs(),
            "tool_results": s.last_results.get(agent, []),
            "legal": list(_LEGAL[agent]),
        }

    def oracle(self, agent: str) -> dict[str, Any]:
        return {k: v for k, v in self.row.items() if k != "responses_create_params"}

    def system_prompt(self, agent: str) -> str:
        role = {
            "solver": "You solve a task with tools, then submit it to a checker: each turn "
            'reply with one JSON object with any of "tool_calls" (e.g. [{"name": ..., '
            '"arguments": {...}}], results arrive next turn), "answer" (text for the final '
            'response), "message" (to the checker) and "submit": true.',
            "checker": "You check a solver's work on a task: you see its tool calls and "
            "results, may call the tools yourself (your calls count in the final response), "
            'then reply {"verdict": "accept"} or {"verdict": "reject", "message": "why"}.',
        }[agent]
        return f"{role}\nTools:\n{self._tools.describe()}"

    def metrics(self) -> dict[str, float]:
        s = self.s
        if s.reward is None:
            return {}
        return {
            "reward": s.reward,
            "success": float(s.reward >= 1.0),
            "accepted": float(s.verdict == "accept"),
            "rejections": float(s.rejections),
            "tool_calls": float(s.tool_calls),
            **s.verified,
        }

    def snapshot(self) -> Any:
        s = self.s
        return {"server": self.server, "row": s.row_index, "phase": s.phase,
                "output": s.output, "reward": s.reward}  # fmt: skip


def _message_text(message: Any) -> str:
    """``[role] text`` of a Responses-API input message (text parts joined)."""
    if not isinstance(message, dict):
        return str(message)
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return f"[{message.get('role', 'user')}] {content}"


def _shown(result: ToolResult) -> str:
    line: str = render_result(result)
    return line if len(line) <= _SHOWN else line[:_SHOWN] + f"... [{len(line) - _SHOWN} more]"


# help(env) shows the scenario's documentation page (this module's docstring).
NemoGymTools.__doc__ = __doc__
