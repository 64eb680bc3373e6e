"""Any parley scenario as a verifiers environment: ``vf-eval`` plays a learner seat.

A verifiers (0.4, ``verifiers.v1``) environment package is a module whose ``__all__``
exports one :class:`~verifiers.v1.Taskset`, one :class:`~verifiers.v1.Env` and, here, one
:class:`~verifiers.v1.Harness`. This module is that package: ``vf-eval`` names it as the
taskset id and plays one seat of a parley scenario with the model under evaluation, while
parley plays every other seat through :class:`~parley.arena.integrations.learner.LearnerArena`
(the same adapter as the OpenEnv server)::

    vf-eval parley.arena.integrations.verifiers_env \\
        --env.taskset.scenario collaboration/referential-v1 --env.taskset.learner listener \\
        --env.taskset.episodes 8 --model tiny --client.base-url http://127.0.0.1:8000/v1 \\
        --client.api-key-var PARLEY_KEY --sampling.temperature 0 --sampling.max-tokens 6 \\
        --env.player.runtime.type subprocess --no-push --no-rich

Contract:

- **Tasks** are the episodes ``parley run --seed SEED --episodes N`` plays: task ``i`` resets
  the scenario with the scenario seed of that run's episode ``i`` (:func:`plan_episodes`),
  so a verifiers run and a parley run of the same seed play the same games.
- **One episode = one interaction** of the ``player`` agent: the learner seat's system
  prompt is the task's system prompt, each of the seat's observations is a user turn, each
  reply is the seat's action after :func:`~parley.agents.llm.parse_action` (what an arena
  :class:`~parley.agents.llm.LLMAgent` with ``use_constraints=0`` plays: the text
  stripped). What the model sees is what an arena LLM agent in the seat would see (no
  other seat's data; no token-budget folding).
- **Rewards**: the trace's one reward, ``parley_return`` (weight 1), is the learner seat's
  return; its reward components (``component/NAME``) and the scenario's episode metrics
  (``metric/NAME``) are trace metrics. A failed parley episode (a partner failed,
  ``max_steps``, the policy's conversation ended before the game did) raises, so verifiers
  records the episode as errored: it is never scored 0.
- One learner seat (verifiers gives an environment one agent per declared role; several
  learner seats are the OpenEnv server's).

The harness (``ParleyHarness``) is verifiers' tool-less ``null`` chat loop run with this
Python instead of a ``uv``-built script environment: ``uv`` fetches the loop's packages
from the network at the first rollout, which an offline machine cannot do, and this
environment already has them (openai, httpx, tenacity, certifi). The player's runtime
must be local (``--env.player.runtime.type subprocess``, the default of this env).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from typing import Any

try:
    import verifiers.v1 as vf
    from verifiers.v1.harnesses.null import NullHarness, NullHarnessConfig
    from verifiers.v1.runtimes import Runtime, SubprocessConfig
except ImportError as error:  # pragma: no cover - the hint is the point
    raise ImportError(
        "the verifiers environment needs verifiers 0.4: pip install --no-deps "
        "verifiers==0.4.0 (see docs/integrations.md for the packages it imports)"
    ) from error

from pydantic import Field

from parley.agents.llm import parse_action
from parley.arena.integrations.learner import LearnerArena, LearnerTurn
from parley.arena.run.config import RunConfig
from parley.arena.run.episode import plan_episodes
from parley.protocols.errors import ParleyError
from parley.scenarios import make

__all__ = [
    "ParleyEnv",
    "ParleyEnvConfig",
    "ParleyHarness",
    "ParleyTask",
    "ParleyTaskset",
    "ParleyTasksetConfig",
    "load_environment",
]

RETURN_REWARD = "parley_return"
"""Name of the trace's reward: the learner seat's return."""


class ParleyTasksetConfig(vf.TasksetConfig):  # type: ignore[misc]  # untyped
    """Which scenario, which seat the model plays, who plays the others, which seeds."""

    scenario: str = "collaboration/referential-v1"
    """A registered scenario id (``parley list``)."""
    learner: str = ""
    """The seat the evaluated model plays; "" is the scenario's first seat."""
    agents: list[str] | dict[str, str] = Field(default_factory=list)
    """Agent specs of the other seats, as ``parley run --agents``: a list in seat order
    over the seats parley plays, or seat -> spec; ``scripted`` where none is given."""
    scenario_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Scenario options (``parley run -s key=value``)."""
    agent_options: dict[str, Any] = Field(default_factory=dict)
    """Options of parley's agents (``llm:`` specs' pool address...), as RunConfig's."""
    seed: int = 0
    """Run seed: task i plays the scenario seed of ``parley run --seed SEED`` episode i."""
    episodes: int = Field(100, ge=1)
    """Tasks (episodes) in the taskset."""
    turn_timeout: float = Field(600.0, gt=0)
    """Seconds any seat may take for one action, the model's included."""
    max_steps: int = Field(10_000, ge=1)
    """Scenario steps after which an episode fails (as ``parley run --max-steps``)."""
    max_sessions: int = Field(128, ge=1)
    """Episodes parley plays at once (vf-eval's default ``--max-concurrent`` is 128)."""


class ParleyData(vf.TaskData):  # type: ignore[misc]  # untyped
    """One episode: the scenario seed it resets with."""

    seed: int
    """Scenario reset seed (``parley run``'s for this episode index)."""


class ParleyTask(vf.Task[ParleyData, vf.State, vf.TaskConfig]):  # type: ignore[misc]  # untyped
    """A parley episode to play."""


class ParleyTaskset(vf.Taskset[ParleyTask, ParleyTasksetConfig]):  # type: ignore[misc]  # untyped
    """The episodes of ``parley run --seed SEED --episodes N`` (module docstring)."""

    def load(self) -> Iterator[ParleyTask]:
        config = self.config
        seats = list(_seats(config))
        run = RunConfig(scenario=config.scenario, episodes=config.episodes, seed=config.seed)
        for plan in plan_episodes(run, seats):
            data = ParleyData(
                name=f"{config.scenario}#{plan.episode_id}",
                prompt=None,  # the environment opens with the seat's first observation
                seed=plan.seed,
            )
            yield ParleyTask(data, config.task)


def _seats(config: ParleyTasksetConfig) -> tuple[str, ...]:
    """The scenario's seats (instantiating it once, as LearnerArena's probe does)."""
    probe = make(config.scenario, **config.scenario_kwargs)
    try:
        return tuple(probe.possible_agents)
    finally:
        probe.close()


class ParleyHarnessConfig(NullHarnessConfig):  # type: ignore[misc]  # untyped
    """verifiers' null harness settings (tool-less chat loop)."""


class ParleyHarness(NullHarness):  # type: ignore[misc]  # untyped
    """The null chat loop run with this interpreter, not a ``uv`` environment."""

    async def setup(self, runtime: Runtime) -> None:
        """Nothing to provision: the loop's packages are this environment's."""

    async def launch(self, ctx: Any, trace: Any, runtime: Runtime, *args: Any, **kw: Any) -> Any:
        return await super().launch(ctx, trace, _LocalPython(runtime), *args, **kw)


class _LocalPython:
    """A runtime whose ``prepare_uv_script`` runs the script with ``sys.executable``.

    Everything else is the wrapped runtime's (the null harness calls only
    ``prepare_uv_script``, ``write`` and ``run_program`` on it).
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(
        self, script: str | bytes, env: dict[str, str] | None = None, *, activate: bool = True
    ) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = f".parley-chat-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self._runtime.write(path, data)  # relative to the run's working directory
        return [sys.executable, path]


class ParleyEnvConfig(vf.EnvConfig):  # type: ignore[misc]  # untyped
    """The one role: the learner seat's player (a local runtime: see the harness)."""

    player: vf.AgentConfig = vf.AgentConfig(runtime=SubprocessConfig())


class ParleyEnv(vf.Env[ParleyEnvConfig]):  # type: ignore[misc]  # untyped
    """Plays each task's parley episode with the model in the learner seat."""

    _arena: LearnerArena | None = None

    async def start(self) -> None:
        config = self.taskset.config
        assert isinstance(config, ParleyTasksetConfig)  # (the taskset's declared config)
        arena = LearnerArena(
            config.scenario,
            learners=[config.learner] if config.learner else None,
            agents=config.agents or None,
            scenario_kwargs=config.scenario_kwargs,
            agent_options=config.agent_options,
            max_sessions=config.max_sessions,
            turn_timeout=config.turn_timeout,
            max_steps=config.max_steps,
            seed=config.seed,
        )
        await arena.__aenter__()
        self._arena = arena

    async def stop(self) -> None:
        arena, self._arena = self._arena, None
        if arena is not None:
            await arena.__aexit__(None, None, None)

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        if self._arena is None:
            raise RuntimeError("the parley arena is not open: ParleyEnv.start() did not run")
        assert isinstance(task.data, ParleyData)  # (ParleyTaskset makes every task)
        session = self._arena.session()
        try:
            turn = await session.reset(seed=task.data.seed)
            system = _system_prompt(turn)
            played = type(task)(task.data.model_copy(update={"system_prompt": system}), task.config)
            async with agents.player.interaction(played) as interaction:
                while not turn.done:
                    segment = await interaction.turn(turn.text)
                    if segment.terminated:  # a turn limit or a model error ended the run
                        break
                    turn = await session.step(parse_action(segment.last_reply, None))
            _score(interaction.trace, turn)
        finally:
            await session.close()


def _system_prompt(turn: LearnerTurn) -> str | None:
    first = turn.messages[0] if turn.messages else {}
    return first["content"] if first.get("role") == "system" else None


def _score(trace: vf.Trace, turn: LearnerTurn) -> None:
    """The learner's return as the trace's reward; a failed episode raises instead."""
    if not turn.done:
        raise ParleyError(
            f"episode {turn.episode}: the player's conversation ended before the episode "
            f"did ({turn.steps} actions played; raise --env.player.max-turns or the "
            "model's context)"
        )
    if turn.failed:
        raise ParleyError(f"episode {turn.episode} failed: {turn.failed}")
    (seat,) = turn.returns
    trace.record_reward(RETURN_REWARD, turn.returns[seat], 1.0)
    for name, value in turn.components[seat].items():
        trace.record_metric(f"component/{name}", value)
    for name, value in turn.metrics.items():
        trace.record_metric(f"metric/{name}", value)


def load_environment(
    scenario: str = "collaboration/referential-v1",
    learner: str = "",
    agents: list[str] | dict[str, str] | None = None,
    **taskset: Any,
) -> ParleyEnv:
    """A :class:`ParleyEnv` for ``scenario`` with the model in seat ``learner`` and
    ``agents`` in the others (other :class:`ParleyTasksetConfig` fields by keyword)."""
    config = ParleyEnvConfig(
        taskset=ParleyTasksetConfig(
            id=__name__, scenario=scenario, learner=learner, agents=agents or [], **taskset
        )
    )
    return ParleyEnv(config)
