"""Conformance suite for registered scenarios, shipped as library code.

Every check takes a scenario id, raises ``AssertionError`` (:class:`ConformanceFailure`) on a
violation and :class:`NotApplicable` when it does not apply; :data:`CHECKS` maps check names
to them and :func:`check_scenario` runs them all. The tests run every check over every
registered scenario; a third-party scenario can do the same::

    from parley.scenarios.conformance import check_scenario
    report = check_scenario("myfamily/my-game-v0")   # {check name: "passed" | "n/a: ..."}

PettingZoo's own tests are used where they apply, working around their known traps: the AEC
``api_test`` crashes on ``Text`` spaces (not used; the parallel test and our contract check
cover it); ``parallel_seed_test`` checks one step only (we run
``seed_test`` on ``parallel_to_aec`` factories and our own whole-episode determinism check);
``parallel_api_test`` overwrites ``env.max_cycles`` (each check builds a fresh env);
``render_test`` asks for ``render_mode="human"`` first: every scenario supports it (it prints
the ansi text), and ``render_test`` runs unmodified.

The hostile check (``hostile``) plays :data:`HOSTILE_TEXTS` and JSON built from
:data:`HOSTILE_VALUES` (under every final key of the seat's ``json`` constraint and as every
argument of every tool its view lists) and requires of each step: no exception, at most
:data:`STEP_CPU_BUDGET_S` of CPU time in the stepping thread (a ``blocking_step`` scenario:
:data:`BLOCKING_STEP_CPU_BUDGET_S`; and :data:`STEP_WALL_LIMIT_S` of
wall time, which also covers sandboxed runs), observations inside their space, ``infos`` that
both JSON and the wire's MessagePack can encode.

The non-interference check (``noninterference``) plays the scripted baselines for each seed,
then, for each seat ``keep``, replays the same actions on an episode of the same seed whose
private data hidden from ``keep`` was redrawn (:meth:`Scenario.redraw_private`, called by
``reset`` before :meth:`Scenario.brief` writes the first observations), and requires
``keep``'s observations and infos to be identical from the first observation to the step
before the last. (What a scenario tells in ``new_episode`` instead of ``brief`` is written
before the redraw and escapes the first comparison.)

The determinism check and :func:`play_episode` play the scripted baselines of the spec
(``spec.baselines``), loaded by their ``"module:Class"`` strings.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import time
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
from pettingzoo.test import (
    max_cycles_test,
    parallel_api_test,
    render_test,
    seed_test,
    state_test,
)
from pettingzoo.utils.conversions import aec_to_parallel, parallel_to_aec

from parley.protocols.messages import Constraint, Observation
from parley.scenarios.base import CHARSET, ORACLE_KEY, Scenario
from parley.scenarios.registry import load_attr, make, spec

__all__ = [
    "CHECKS",
    "ConformanceFailure",
    "NotApplicable",
    "GARBAGE",
    "HOSTILE_TEXTS",
    "HOSTILE_VALUES",
    "check_scenario",
    "play_episode",
    "baseline_agents",
    "agent_seed",
    "oracle_info",
]


class ConformanceFailure(AssertionError):
    """A scenario breaks the contract; the message says which part."""


class NotApplicable(Exception):
    """The check does not apply to this scenario (the message says why)."""


GARBAGE: tuple[Any, ...] = (
    "",
    " ",
    "\n\n\n",
    "x" * 100_000,
    "héllo wörld 🤝 交渉",
    "\x00\x01\x02\x7f\x1b[31m",
    "<selection>" * 50,
    "@nobody: hi",
    "@all:",
    "1e309 nan -0 99999999999999999999",
    "}{][)(",
    b"bytes are not text",
    None,
    12345,
    ["a", "list"],
)
"""Actions the fuzz check feeds to every seat besides random ``Text`` samples."""

HOSTILE_TEXTS: tuple[str, ...] = (
    "1e999999999",
    "9" * 4400,
    "\x00\x1b[2J\x7f",
    "\ud800\udfff",
    "caf\u00e9 \u4ea4\u6e09 \U0001f91d",
    "<selection>\n" + "book=" + "9" * 900,
    "[Offer: " + "9" * 900 + " Wood -> 1 Gold] [Accept]",
    "propose: " + " ".join(["1e999999999"] * 10),
    "[" * 999,
    '{"tool_calls": ' + "[" * 990,
    # Regex backtracking (lazy groups followed by optional runs, runs of separators):
    "[Offer: x" + " " * 990 + "y",
    "[Offer: x" + " " * 500 + "." * 480 + "y]",
    "[offer: i give" + " ;" * 490,
    "book=1" + " " * 990,
    "propose: " + "1 " * 495,
    "@" + "a," * 499,
)
"""Raw hostile actions (some lie outside the action space: they must be invalid moves)."""

HOSTILE_VALUES: tuple[str, ...] = (
    '"1e999999999"',
    "1e999999999",
    '"-1E-999999999"',
    "7" * 4301,
    "-" + "7" * 300,
    '"' + "9" * 900 + '"',
    "[" * 70 + "]" * 70,
    '{"a": ' * 70 + "1" + "}" * 70,
    '"\\u0000\\u001b[2J\\ud800\\udfff\\u00e9\\u4ea4"',
    '"' + "\\ud800" * 200 + '"',
    "NaN",
    "-Infinity",
    "null",
    '{"__proto__": {"x": 1}}',
    '"import time\\nwhile True:\\n    time.sleep(1)\\n"',
)
"""JSON value texts the hostile check puts under every key and tool argument it finds (the
last, a script that never ends, also fills one turn with :data:`HOSTILE_MAX_CALLS` calls of
each tool: a scenario that runs code must bound the whole step, not only each run)."""

HOSTILE_MAX_CALLS = 8
"""Tool calls per turn in the hostile many-calls action (``parse_turn``'s maximum)."""

STEP_CPU_BUDGET_S = 0.05
"""Most CPU time one ``step`` may take in the stepping thread, on any action."""
# The waiting thread polls the children's run-queue counters every 0.25 s and looks them up
# in /proc at each deadline, so its CPU grows with the wait and the host's process count: a
# hostile submission that sleeps out its 8 s run took 13-19 ms here alone, and 58 ms once in a
# loaded fresh-clone `make test` (over the 50 ms budget; nothing else in that step changed).
BLOCKING_STEP_CPU_BUDGET_S = 0.25
"""The same for a scenario whose ``step`` waits on child processes (``metadata
["blocking_step"]``: code/debug's sandbox runs, up to its ``max_step_wall_s``)."""
STEP_WALL_LIMIT_S = 5.0
"""Most wall time one ``step`` may take (sandboxed tool runs wait on a child process),
unless the scenario declares a larger bound as its ``max_step_wall_s`` attribute (code/debug:
its per-step tool budget plus the hidden-test run's limit)."""


def _fail(message: str) -> ConformanceFailure:
    return ConformanceFailure(message)


def _aec_factory(scenario_id: str) -> Callable[..., Any]:
    def factory(render_mode: str | None = "ansi", **kwargs: Any) -> Any:
        return parallel_to_aec(make(scenario_id, render_mode=render_mode, **kwargs))

    return factory


# --- checks --------------------------------------------------------------------------------


def check_contract(scenario_id: str) -> None:
    """Our contract: Text spaces over CHARSET, metadata, prompts, infos, state, metrics."""
    env = make(scenario_id)
    if not isinstance(env, Scenario):
        raise _fail(f"{scenario_id} builds a {type(env).__name__}, not a parley Scenario")
    meta = env.metadata
    if meta.get("name") != scenario_id:
        raise _fail(f"metadata['name'] is {meta.get('name')!r}, expected {scenario_id!r}")
    if "ansi" not in meta.get("render_modes", []) or not meta.get("is_parallelizable"):
        raise _fail("metadata needs render_modes containing 'ansi' and is_parallelizable=True")
    for agent in env.possible_agents:
        for space in (env.observation_space(agent), env.action_space(agent)):
            if not set(CHARSET) <= space.character_set:
                raise _fail(f"space of {agent} lacks printable ASCII or newline")
        prompt = env.system_prompt(agent)
        if not isinstance(prompt, str) or not prompt or any(c not in CHARSET for c in prompt):
            raise _fail(f"system_prompt({agent!r}) must be non-empty printable ASCII")
    observations, infos = env.reset(seed=1)
    _check_step_output(env, observations, infos)
    while env.agents:
        actions = {a: env.action_space(a).sample() for a in env.agents}
        observations, rewards, _, _, infos = env.step(actions)
        _check_step_output(env, observations, infos)
        for agent, value in rewards.items():
            total = sum(infos[agent]["components"].values())
            if not np.isclose(value, total):
                raise _fail(f"reward of {agent} ({value}) is not the sum of its components")
        if not env.state_space.contains(env.state()):
            raise _fail("state() is outside state_space")
    metrics = env.episode_metrics()
    if not all(isinstance(k, str) and isinstance(v, float) for k, v in metrics.items()):
        raise _fail(f"episode_metrics() must map names to floats, got {metrics!r}")
    if "success" in metrics and metrics["success"] not in (0.0, 1.0):
        raise _fail(f"metric success must be 0 or 1, got {metrics['success']}")


def _check_step_output(env: Any, observations: dict[str, Any], infos: dict[str, Any]) -> None:
    for agent, text in observations.items():
        if not env.observation_space(agent).contains(text):
            raise _fail(f"observation of {agent} is outside its space: {text[:200]!r}")
        info = infos[agent]
        if ORACLE_KEY in info:
            raise _fail(f"infos[{agent!r}] holds {ORACLE_KEY!r}: privileged data goes to oracle()")
        if not isinstance(info.get("to_act", True), bool):
            raise _fail(f"infos[{agent!r}]['to_act'] must be a bool")
        if "constraint" in info:
            try:
                msgspec.convert(info["constraint"], Constraint)
            except msgspec.ValidationError as exc:
                raise _fail(f"infos[{agent!r}]['constraint'] is not a Constraint: {exc}") from exc
        try:
            json.dumps(info)
        except TypeError as exc:
            raise _fail(f"infos[{agent!r}] holds a value that is not plain JSON: {exc}") from exc
    if env.agents and not any(infos[a].get("to_act", True) for a in env.agents):
        raise _fail("a live episode must ask at least one seat to act")


def check_parallel_api(scenario_id: str) -> None:
    """pettingzoo ``parallel_api_test`` (random Text samples as actions)."""
    parallel_api_test(make(scenario_id), num_cycles=200)
    aec = parallel_to_aec(make(scenario_id))
    if not isinstance(aec_to_parallel(aec).unwrapped, Scenario):
        raise _fail("aec_to_parallel(parallel_to_aec(env)) does not round-trip")


def check_seed(scenario_id: str) -> None:
    """pettingzoo ``seed_test`` on ``parallel_to_aec`` factories."""
    factory = _aec_factory(scenario_id)
    seed_test(factory, num_cycles=50)


def check_render(scenario_id: str) -> None:
    """pettingzoo ``render_test``, unmodified ("human" prints, "ansi" returns the text)."""
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        render_test(_aec_factory(scenario_id))
    if "human" in make(scenario_id).metadata["render_modes"] and not printed.getvalue():
        raise _fail('render_mode="human" printed nothing')


def check_state(scenario_id: str) -> None:
    """pettingzoo ``state_test``: ``state()`` lies in ``state_space`` through an episode."""
    state_test(parallel_to_aec(make(scenario_id)), make(scenario_id), num_cycles=10)


def check_max_cycles(scenario_id: str) -> None:
    """pettingzoo ``max_cycles_test``, where random play cannot end the episode in 4 steps."""
    probe = make(scenario_id, max_cycles=4)
    probe.reset(seed=0)
    for _ in range(4):
        _, _, terminations, _, _ = probe.step(
            {a: probe.action_space(a).sample() for a in probe.agents}
        )
        if any(terminations.values()):
            raise NotApplicable("random play ends this scenario's episodes within 4 steps")
    module = types.SimpleNamespace(
        parallel_env=lambda **kw: make(scenario_id, **kw),
        env=lambda **kw: parallel_to_aec(make(scenario_id, **kw)),
    )
    max_cycles_test(module)


def check_determinism(scenario_id: str, seeds: Sequence[int] = (0, 1, 2)) -> None:
    """Same seed -> identical transcript over whole episodes of the scripted baselines."""
    for seed in seeds:
        first = play_episode(scenario_id, seed=seed)
        second = play_episode(scenario_id, seed=seed)
        if first != second:
            diff = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
            raise _fail(
                f"seed {seed}: transcripts differ at record {diff}: {first[diff]} != {second[diff]}"
            )


def check_fuzz(scenario_id: str, episodes: int = 3) -> None:
    """Garbage and random Text samples to every seat: no exception, invalid moves recorded."""
    rng = np.random.default_rng(0)
    env = make(scenario_id)
    for episode in range(episodes):
        _, infos = env.reset(seed=episode)
        for agent in env.possible_agents:
            env.action_space(agent).seed(episode)
        while env.agents:
            actions: dict[str, Any] = {}
            for agent in env.agents:
                pick = int(rng.integers(len(GARBAGE) + 1))
                sample = env.action_space(agent).sample()
                actions[agent] = GARBAGE[pick] if pick < len(GARBAGE) else sample
            acting = [a for a in env.agents if infos[a].get("to_act", True)]
            observations, _, _, _, infos = env.step(actions)
            _check_step_output(env, observations, infos)
            for agent in acting:
                action = actions[agent]
                off_space = not env.action_space(agent).contains(action)
                if off_space and "invalid" not in infos[agent]:
                    raise _fail(f"{agent} played {str(action)[:60]!r}, not recorded as invalid")
        env.episode_metrics()


def _final_keys(info: dict[str, Any]) -> list[str]:
    """The final keys (``answer``, ``message``, ...) of a seat's ``json`` constraint."""
    constraint = info.get("constraint") or {}
    if constraint.get("type") != "json":
        return []
    schema = json.loads(constraint.get("json_schema") or "{}")
    keys = [key for form in schema.get("anyOf", []) for key in form.get("properties", {})]
    return sorted(set(keys) - {"tool_calls"})


def _tool_params(info: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """``(tool name, parameter names)`` for every tool in a seat's view."""
    view = info.get("view") or {}
    out = []
    for spec_ in view.get("tools", []) if isinstance(view, dict) else []:
        function = spec_.get("function", {})
        params = list(function.get("parameters", {}).get("properties", {}))
        out.append((str(function.get("name", "")), params))
    return out


def hostile_actions(info: dict[str, Any]) -> list[str]:
    """Every hostile action for a seat whose latest infos are ``info``."""
    actions = list(HOSTILE_TEXTS)
    for key in _final_keys(info) or ["answer", "message"]:
        actions += [f'{{"{key}": {value}}}' for value in HOSTILE_VALUES]
    for name, params in _tool_params(info):
        for value in HOSTILE_VALUES:
            args = "{" + ", ".join(f'"{p}": {value}' for p in params) + "}"
            call = f'{{"tool_calls": [{{"name": "{name}", "arguments": {args}}}]}}'
            actions += [call, f'{{"tool_calls": [{{"name": "{name}", "arguments": {value}}}]}}']
        endless = HOSTILE_VALUES[-1]
        args = "{" + ", ".join(f'"{p}": {endless}' for p in params) + "}"
        many = ", ".join([f'{{"name": "{name}", "arguments": {args}}}'] * HOSTILE_MAX_CALLS)
        actions.append(f'{{"tool_calls": [{many}]}}')
    return actions


def check_hostile(scenario_id: str) -> dict[str, float]:
    """Hostile actions (module docstring): cheap, safe, observations in space.

    Returns the largest CPU and wall time of one step, in seconds.
    """
    env = make(scenario_id)
    wall_limit = float(getattr(env.unwrapped, "max_step_wall_s", STEP_WALL_LIMIT_S))
    blocking = bool(getattr(env.unwrapped, "metadata", {}).get("blocking_step", False))
    cpu_limit = BLOCKING_STEP_CPU_BUDGET_S if blocking else STEP_CPU_BUDGET_S
    worst = {"cpu_s": 0.0, "wall_s": 0.0}
    _, infos = env.reset(seed=0)
    queues = {seat: hostile_actions(infos[seat]) for seat in env.possible_agents}
    episode, budget = 0, 4 * sum(map(len, queues.values())) + 100
    while any(queues.values()) and budget > 0:
        budget -= 1
        acting = [a for a in env.agents if infos[a].get("to_act", True)]
        actions = {a: (queues[a].pop(0) if a in acting and queues[a] else "") for a in env.agents}
        # The cyclic GC is paused while a step is timed: a full collection walks the whole
        # process (in a test session: torch, vLLM, ...), which is not the step's cost (a 52 ms
        # "step" on a retail-desk action in a full run was one).
        collecting = gc.isenabled()
        gc.disable()
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            observations, _, _, _, infos = env.step(actions)
        except Exception as exc:
            shown = {a: v[:80] for a, v in actions.items()}
            raise _fail(f"step raised {exc!r} on hostile actions {shown}") from exc
        finally:
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            if collecting:
                gc.enable()
        worst = {"cpu_s": max(worst["cpu_s"], cpu), "wall_s": max(worst["wall_s"], wall)}
        shown_action = {a: v[:80] for a, v in actions.items() if v}
        if cpu > cpu_limit or wall > wall_limit:
            raise _fail(f"a step took {cpu:.3f} s CPU / {wall:.3f} s wall on {shown_action}")
        _check_step_output(env, observations, infos)
        for agent, info in infos.items():
            try:
                msgspec.msgpack.encode(info)
            except (TypeError, UnicodeEncodeError, OverflowError) as exc:
                raise _fail(f"infos[{agent!r}] cannot go on the wire: {exc}") from exc
        if not env.agents:
            episode += 1
            _, infos = env.reset(seed=episode)
        elif not any(queues[a] for a in env.agents if infos[a].get("to_act", True)):
            # The seats asked now have nothing left to try: let them pass the turn.
            for agent in env.agents:
                if not queues[agent] and infos[agent].get("to_act", True):
                    queues[agent] = [""] if any(queues.values()) else []
    return worst


def check_noninterference(scenario_id: str, seeds: Sequence[int] = (0, 1, 2)) -> None:
    """Redrawing what a seat may not know never changes what it sees (module docstring).

    Every seed of ``seeds`` whose episode hides something from some seat is checked (a
    seed whose draw happens to hide nothing, or whose redraw finds no other value, is
    skipped, not taken for the scenario hiding nothing); not applicable when none does."""
    hiding = [seed for seed in seeds if _hides(scenario_id, seed)]
    if not hiding:
        raise NotApplicable(f"nothing in an episode is hidden from any seat (seeds {list(seeds)})")
    seats = make(scenario_id).possible_agents
    for seed in hiding:
        trace: list[dict[str, str]] = []
        asyncio.run(_play(scenario_id, seed, None, None, {}, trace))
        for index, keep in enumerate(seats):
            _replay_redrawn(scenario_id, seed, keep, trace, np.random.default_rng([seed, index]))


def _hides(scenario_id: str, seed: int) -> bool:
    probe = make(scenario_id)
    probe.reset(seed=seed)
    rng = np.random.default_rng(seed)
    try:
        return any([probe.redraw_private(seat, rng) for seat in probe.agents])
    except NotImplementedError as exc:
        raise NotApplicable(f"the scenario defines no redraw_private hook ({exc})") from exc


def _replay_redrawn(
    scenario_id: str,
    seed: int,
    keep: str,
    trace: list[dict[str, str]],
    rng: np.random.Generator,
) -> None:
    probe = make(scenario_id)
    probe.reset(seed=seed)
    redraw_seed = int(rng.integers(2**32))
    if not probe.redraw_private(keep, np.random.default_rng(redraw_seed)):
        return
    redraw = {"keep": keep, "seed": redraw_seed}
    plain, redrawn = make(scenario_id), make(scenario_id)
    first = plain.reset(seed=seed)
    # Redrawn between new_episode and brief: first observations are checked too.
    again = redrawn.reset(seed=seed, options={"redraw_private": redraw})
    _compare(seed, -1, keep, (first[0], first[1]), (again[0], again[1]))
    for turn, actions in enumerate(trace):
        seen = plain.step(actions)
        if not plain.agents:
            return  # the last step may reveal the private data (the outcome)
        other = redrawn.step(actions)
        if not redrawn.agents:
            raise _fail(f"seed {seed}: redrawing what {keep} may not know ended step {turn}")
        _compare(seed, turn, keep, (seen[0], seen[4]), (other[0], other[4]))


def _compare(
    seed: int, turn: int, keep: str, seen: tuple[Any, Any], other: tuple[Any, Any]
) -> None:
    when = "the first observation" if turn < 0 else f"step {turn}"
    for name, a, b in (
        ("observation", seen[0][keep], other[0][keep]),
        ("infos", _canonical(seen[1][keep]), _canonical(other[1][keep])),
    ):
        if a != b:
            raise _fail(
                f"seed {seed}, {when}: {keep}'s {name} depends on data it may not "
                f"know:\n  {str(a)[:400]}\n  {str(b)[:400]}"
            )


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


CHECKS: dict[str, Callable[[str], Any]] = {
    "contract": check_contract,
    "parallel_api": check_parallel_api,
    "seed": check_seed,
    "render": check_render,
    "state": check_state,
    "max_cycles": check_max_cycles,
    "determinism": check_determinism,
    "fuzz": check_fuzz,
    "hostile": check_hostile,
    "noninterference": check_noninterference,
}
"""Every conformance check, by name."""


def check_scenario(scenario_id: str) -> dict[str, str]:
    """Run every check; returns ``{name: "passed" | "n/a: reason"}`` or raises on failure."""
    report: dict[str, str] = {}
    for name, check in CHECKS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                check(scenario_id)
            except NotApplicable as why:
                report[name] = f"n/a: {why}"
                continue
        report[name] = "passed"
    return report


# --- playing baselines ------------------------------------------------------------------------


def baseline_agents(scenario_id: str, seats: Sequence[str]) -> dict[str, Any]:
    """One fresh scripted baseline agent per seat, from the spec's ``"module:Class"`` strings."""
    found = spec(scenario_id)
    return {seat: load_attr(found.baseline_for(seat))() for seat in seats}


def play_episode(
    scenario_id: str,
    *,
    seed: int,
    agents: dict[str, Any] | None = None,
    env: Scenario | None = None,
    **kwargs: Any,
) -> list[tuple[Any, ...]]:
    """Play one episode in-process; returns its transcript as comparable records.

    ``agents`` default to the spec's baselines; each is reset with :func:`agent_seed`. The
    transcript holds per step: each acting seat's observation, action, reward, infos, and at
    the end the episode metrics. Runs its own event loop: call it from synchronous code.
    """
    return asyncio.run(_play(scenario_id, seed, agents, env, kwargs))


def oracle_info(env: Scenario, agent: Any, seat: str) -> dict[str, Any]:
    """``{ORACLE_KEY: env.oracle(seat)}`` for an agent whose class is ``privileged``, else
    ``{}`` (the rule the runner follows for in-process agents)."""
    if getattr(type(agent), "privileged", False) is True:
        return {ORACLE_KEY: env.oracle(seat)}
    return {}


def agent_seed(seed: int, index: int) -> int:
    """The seed of the agent in seat ``index`` for an episode of ``seed``.

    Derived through ``SeedSequence`` so the agent's stream is independent of the
    scenario's: with ``seed + index``, seat 0 would replay the scenario's own random draws
    (a scripted agent guessing the hidden answer).
    """
    return int(np.random.SeedSequence((seed, index + 1)).generate_state(1)[0])


async def _play(
    scenario_id: str,
    seed: int,
    agents: dict[str, Any] | None,
    env: Scenario | None,
    kwargs: dict[str, Any],
    trace: list[dict[str, str]] | None = None,
) -> list[tuple[Any, ...]]:
    env = env if env is not None else make(scenario_id, **kwargs)
    agents = agents if agents is not None else baseline_agents(scenario_id, env.possible_agents)
    for index, seat in enumerate(env.possible_agents):
        agents[seat].reset(agent_seed(seed, index))
    observations, infos = env.reset(seed=seed)
    rewards: dict[str, float] = dict.fromkeys(env.agents, 0.0)
    record: list[tuple[Any, ...]] = []
    while env.agents:
        actions: dict[str, str] = {}
        for agent in env.agents:
            if not infos[agent].get("to_act", True):
                actions[agent] = ""
                continue
            observation = Observation(
                agent=agent,
                text=observations[agent],
                scenario=scenario_id,
                reward=rewards.get(agent, 0.0),
                info={**infos[agent], **oracle_info(env, agents[agent], agent)},
            )
            action = await agents[agent].act(observation)
            actions[agent] = action.text
            record.append((env.turn, agent, observations[agent], action.text))
        if trace is not None:
            trace.append(actions)
        observations, rewards, _, _, infos = env.step(actions)
        record.append(
            (env.turn, json.dumps(rewards, sort_keys=True), json.dumps(infos, sort_keys=True))
        )
    record.append(("metrics", json.dumps(env.episode_metrics(), sort_keys=True)))
    return record
