"""verl: a parley seat as a multi-turn tool of verl 0.9's ``tool_agent`` loop.

verl 0.9 (0.9.1 on PyPI, and 0.8.0 already) has no ``verl.interactions`` package: the
Interaction API of earlier releases is gone, and an environment reaches a multi-turn
rollout as a *tool* of ``ToolAgentLoop`` (``verl/experimental/agent_loop/tool_agent_loop.py``),
declared in a tool config YAML that ``verl.tools.tool_registry.initialize_tools_from_config``
loads. :class:`ParleyTool` is such a tool: the model under training plays one learner seat
of a parley scenario by calling it with its action, and gets the seat's next observation
back, while parley plays every other seat through
:class:`~parley.arena.integrations.learner.LearnerArena` (the adapter of the OpenEnv server,
TRL's rollout and the verifiers environment)::

    # tools.yaml, named by actor_rollout_ref.rollout.multi_turn.tool_config_path
    tools:
      - class_name: parley.arena.integrations.verl_tool.ParleyTool
        config: {type: native, scenario: collaboration/referential-v1, learner: listener}

The dataset's rows come from :func:`dataset_rows` (each row's ``agent_name`` is
``tool_agent``), and the reward from :func:`compute_score`
(``reward.custom_reward_function.path``/``name``).

Contract, following how ``ToolAgentLoop._call_tool`` calls a ``BaseTool`` (verl 0.9.1,
``tool_agent_loop.py`` lines 485-496: ``create(create_kwargs=...)``, then ``execute(
instance_id, arguments, agent_data=...)``, then ``release(instance_id)``, once *per tool
call*, with a fresh instance id each time):

- **One episode per trajectory.** The instance id does not outlive a call, so the episode
  is keyed by the trajectory: ``agent_data.extra_fields["parley"]`` (the place verl leaves
  for tool session data) holds its public state. A trajectory's first call resets the
  scenario with its row's seed (``create_kwargs.seed``) and plays the action; the row's
  prompt is that reset's first observation (:func:`dataset_rows`), which the first call
  checks (a prompt that is not the observation fails the episode: ``prompt_mismatch``).
- **Responses and rewards.** A call answers with the seat's next observation and its
  reward since the last action (the last call's reward is what is left of the return),
  so the tool rewards of an episode sum to the seat's return, which
  ``extra_fields["parley"]["return"]`` also holds at the end, with the reward
  ``components``, the scenario's ``metrics`` and ``failed``.
- **Failures** are LearnerArena's: the scenario judges invalid moves (as ``parley run``
  does); a partner's failure, ``max_steps`` or ``turn_timeout`` fails the episode with a
  reason and the reward ``None`` (verl then records no tool reward). :func:`compute_score`
  refuses a failed or unfinished episode unless ``failed_score`` is given
  (``reward_kwargs``): it is never scored 0 silently. Trainer mistakes (no ``action``
  string, a call after the end) answer a ``parley: CODE: ...`` text with reward 0.0 and
  change nothing.
- **Bounded.** verl never says that a trajectory ended (its response length ran out
  mid-game): at most ``max_sessions`` episodes are held; starting one more ends the least
  recently used, and an episode no call touched in ``idle_calls`` calls of this tool is
  ended too (counted in calls, the tool's own work: no wall clock that a busy machine
  could fake). An ended episode's next call answers ``episode_over`` with the reason.

One tool per event loop (verl's agent loop worker runs one); :meth:`ParleyTool.close`
ends its episodes and the arena.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

try:
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
except ImportError as error:  # pragma: no cover - the hint is the point
    raise ImportError(
        "the verl tool needs verl 0.9: pip install --no-deps verl==0.9.1 and the parley "
        "'integrations' extra (see docs/integrations.md for the modules it imports)"
    ) from error

from parley.arena.integrations.held import HeldEpisodes
from parley.arena.integrations.learner import (
    LearnerArena,
    LearnerError,
    LearnerSession,
    LearnerTurn,
)
from parley.arena.run.config import RunConfig
from parley.arena.run.episode import plan_episodes
from parley.protocols.errors import ConfigError, ParleyError

# What verl names: ParleyTool (the tool YAML's class_name), compute_score
# (custom_reward_function.name), and dataset_rows (the dataset).
__all__ = ["ParleyTool", "compute_score", "dataset_rows"]

STATE_KEY = "parley"
"""The key of a trajectory's episode state in verl's ``AgentData.extra_fields`` (and so in
the reward function's ``extra_info``)."""


@dataclass
class ParleyToolConfig:
    """The tool's ``config`` mapping of the tool YAML (verl's own ``type`` key aside)."""

    scenario: str = "collaboration/referential-v1"
    """A registered scenario id (``parley list``)."""
    learner: str = ""
    """The seat the trained model plays; "" is the scenario's first seat."""
    agents: list[str] | dict[str, str] = field(default_factory=list)
    """Specs of the other seats, as ``parley run --agents`` (``scripted`` where none)."""
    scenario_kwargs: dict[str, Any] = field(default_factory=dict)
    """Scenario options (``parley run -s key=value``)."""
    agent_options: dict[str, Any] = field(default_factory=dict)
    """Options of parley's agents (an ``llm:`` spec's pool address...), as RunConfig's."""
    name: str = "parley"
    """The tool's function name (the model calls it with ``{"action": ...}``)."""
    max_sessions: int = 256
    """Episodes held at once; one more ends the least recently used."""
    idle_calls: int = 0
    """Calls of this tool after which an untouched episode ends; 0 is 8 x max_sessions."""
    turn_timeout: float = 600.0
    """Seconds any seat may take for one action, the model's (its generation) included."""
    max_steps: int = 10_000
    """Scenario steps after which an episode fails (as ``parley run --max-steps``)."""

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.idle_calls < 0 or self.turn_timeout <= 0:
            raise ConfigError(
                "parley tool: max_sessions must be 1 or more, idle_calls 0 or more and "
                f"turn_timeout positive (got {self.max_sessions}, {self.idle_calls}, "
                f"{self.turn_timeout})"
            )
        if not self.idle_calls:
            self.idle_calls = 8 * self.max_sessions

    @classmethod
    def from_verl(cls, config: Mapping[str, Any]) -> ParleyToolConfig:
        """The settings of a tool YAML's ``config`` (its ``type`` is verl's)."""
        known = {f.name for f in dataclasses.fields(cls)}
        given = {key: value for key, value in config.items() if key != "type"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(f"parley tool: unknown config keys {unknown}; known: {sorted(known)}")
        return cls(**given)

    def arena(self) -> LearnerArena:
        """The learner arena these settings describe (not opened)."""
        return LearnerArena(
            self.scenario,
            learners=[self.learner] if self.learner else None,
            agents=self.agents or None,
            scenario_kwargs=self.scenario_kwargs,
            agent_options=self.agent_options,
            max_sessions=self.max_sessions,
            turn_timeout=self.turn_timeout,
            max_steps=self.max_steps,
        )


@dataclass
class _Episode:
    """A trajectory's episode: its public state (in verl's extra_fields) and session."""

    state: dict[str, Any]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    session: LearnerSession | None = None  # set by the trajectory's first call


class ParleyTool(BaseTool):  # type: ignore[misc,unused-ignore]  # Any where verl is absent
    """A parley learner seat as a verl ``BaseTool`` (module docstring)."""

    def __init__(self, config: dict[str, Any], tool_schema: Any = None) -> None:
        self.settings = ParleyToolConfig.from_verl(config)
        super().__init__(config, tool_schema)
        self._arena: LearnerArena | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None
        self._seeds: OrderedDict[str, int] = OrderedDict()  # instance id -> create's seed
        self._held: HeldEpisodes[str, _Episode] = HeldEpisodes(
            max_sessions=self.settings.max_sessions, idle_calls=self.settings.idle_calls
        )

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        settings = self.settings
        return OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": settings.name,
                    "description": (
                        f"Play your next action in the {settings.scenario} game; returns what "
                        "you observe next."
                    ),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "action": {"type": "string", "description": "your action, as text"}
                        },
                        "required": ["action"],
                    },
                },
            }
        )

    @property
    def episodes(self) -> int:
        """Episodes held now."""
        return len(self._held)

    async def create(
        self,
        instance_id: str | None = None,
        create_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> tuple[str, ToolResponse]:
        """A call's instance: ``create_kwargs["seed"]`` is its row's scenario seed."""
        seed = (create_kwargs or {}).get("seed")
        if type(seed) is not int or seed < 0:
            raise LearnerError(
                "bad_action",
                f"create_kwargs.seed must be a non-negative integer, got {seed!r} (build the "
                "dataset with parley's dataset_rows)",
            )
        instance_id = instance_id or uuid.uuid4().hex
        self._seeds[instance_id] = seed
        while len(self._seeds) > 64 * self.settings.max_sessions:  # callers that never release
            self._seeds.popitem(last=False)
        return instance_id, ToolResponse()

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._seeds.pop(instance_id, None)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], agent_data: Any = None, **kwargs: Any
    ) -> tuple[ToolResponse, float | None, dict[str, Any]]:
        """Play ``parameters["action"]`` in the episode of ``agent_data``'s trajectory."""
        self._held.call()
        seed = self._seeds.get(instance_id)
        action = parameters.get("action") if isinstance(parameters, Mapping) else None
        if seed is None:
            return _refused("no_episode", f"instance {instance_id!r} was not created: call create")
        extra = getattr(agent_data, "extra_fields", None)
        if not isinstance(extra, dict):
            return _refused("no_episode", "the episode is the trajectory's: pass verl's agent_data")
        if not isinstance(action, str):
            return _refused("bad_action", f'call {self.name} with {{"action": "<your action>"}}')
        state = extra.get(STATE_KEY)
        if not isinstance(state, dict) or state.get("episode") not in self._held:
            if isinstance(state, dict) and state.get("done"):
                return _refused("episode_over", f"the episode is over ({_why(state)})")
            state = _new_state(seed)  # the trajectory's first call (synchronously: no race)
            extra[STATE_KEY] = state
            self._held.add(state["episode"], _Episode(state))
        key = state["episode"]
        episode = self._held[key]
        # Never idle while a call of it is played or waits its turn; idle from the answer on.
        with self._held.playing(key):
            async with episode.lock:  # a turn's parallel calls play one after another
                if state["done"]:
                    return _refused("episode_over", f"the episode is over ({_why(state)})")
                await self._reap()
                try:
                    turn = await self._play(episode, action, agent_data)
                except LearnerError as error:
                    return _refused(error.code, str(error).split(": ", 1)[-1])
                state["steps"] = turn.steps
                if turn.done:
                    await self._end(key, turn)
        return ToolResponse(text=_response(turn)), turn.reward, {"done": turn.done}

    async def close(self) -> None:
        """End every episode and close the arena (idempotent)."""
        for key in self._held.in_order():
            await self._end(key, "closed: the tool was closed")
        arena, self._arena = self._arena, None
        if arena is not None:
            await arena.__aexit__(None, None, None)

    # ---------------------------------------------------------------- machinery

    async def _play(self, episode: _Episode, action: str, agent_data: Any) -> LearnerTurn:
        """The turn after ``action``; the first call starts the episode and checks the
        prompt against its first observation."""
        session = episode.session
        if session is None:
            session = episode.session = (await self._open()).session()
            turn = await session.reset(seed=episode.state["seed"])
            prompt = _first_user_text(getattr(agent_data, "messages", None))
            if turn.done:
                return turn
            if prompt is not None and prompt != turn.text:
                await session.close()  # the end is a failure, with the reason
                return LearnerTurn(
                    episode=turn.episode,
                    done=True,
                    reward=None,
                    failed="prompt_mismatch: the trajectory's prompt is not the seat's first "
                    f"observation of seed {episode.state['seed']} (build the rows with "
                    "dataset_rows and the tool's config)",
                )
        return await session.step(action)

    async def _open(self) -> LearnerArena:
        loop = asyncio.get_running_loop()
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._arena is None:
                arena = self.settings.arena()
                await arena.__aenter__()
                self._arena, self._loop = arena, loop
        if loop is not self._loop:
            raise ParleyError("a ParleyTool serves one event loop (make one tool per loop)")
        return self._arena

    async def _reap(self) -> None:
        """End episodes idle past ``idle_calls``, then the least recent past capacity. One
        whose call is being played (its partner slow to answer) is not idle."""
        for key in self._held.idle():
            await self._end(key, f"reaped: no call in {self.settings.idle_calls} tool calls")
        for key in self._held.over():
            await self._end(
                key, f"reaped: {self.settings.max_sessions} episodes held (max_sessions)"
            )

    async def _end(self, key: str, end: LearnerTurn | str) -> None:
        episode = self._held.pop(key)
        if episode is None:
            return
        state = episode.state
        state["done"] = True
        if isinstance(end, str):
            state["failed"] = end
        else:
            seat = next(iter(end.returns), "")
            state["failed"] = end.failed
            state["return"] = end.returns.get(seat)
            state["components"] = dict(end.components.get(seat, {}))
            state["metrics"] = dict(end.metrics)
        if episode.session is not None:
            await episode.session.close()


def _new_state(seed: int) -> dict[str, Any]:
    return {
        "episode": uuid.uuid4().hex,
        "seed": seed,
        "steps": 0,
        "done": False,
        "return": None,
        "failed": "",
        "components": {},
        "metrics": {},
    }


def _why(state: Mapping[str, Any]) -> str:
    return str(state.get("failed") or "it ended")


def _refused(code: str, message: str) -> tuple[ToolResponse, float, dict[str, Any]]:
    """A trainer mistake: nothing was played, nothing earned."""
    return ToolResponse(text=f"parley: {code}: {message}"), 0.0, {"done": False}


def _response(turn: LearnerTurn) -> str:
    if not turn.done:
        return str(turn.text)
    return f"The episode failed: {turn.failed}" if turn.failed else "The episode is over."


def _first_user_text(messages: Any) -> str | None:
    for message in messages or ():
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None


def compute_score(
    data_source: str = "",
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    failed_score: float | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl's custom reward function: the learner seat's return (``parley_finished`` 1.0).

    A failed or unfinished episode raises :class:`ParleyError` with the reason, unless
    ``failed_score`` (``custom_reward_function.reward_kwargs``) says what to score it
    (``parley_finished`` 0.0 then marks it in verl's reward extra info).
    """
    state = (extra_info or {}).get(STATE_KEY)
    if isinstance(state, Mapping) and state.get("done") and not state.get("failed"):
        return {"score": float(state["return"]), "parley_finished": 1.0}
    if failed_score is None:
        reason = _why(state) if isinstance(state, Mapping) and state.get("done") else "unfinished"
        raise ParleyError(
            f"parley episode not scorable ({reason}): give reward_kwargs.failed_score to "
            "score failed and unfinished episodes, or raise the response length"
        )
    return {"score": float(failed_score), "parley_finished": 0.0}


def dataset_rows(
    config: ParleyToolConfig | Mapping[str, Any], episodes: int, seed: int = 0
) -> list[dict[str, Any]]:
    """verl dataset rows (RLHFDataset's parquet columns) of ``parley run --seed SEED
    --episodes N``'s scenario seeds: the prompt is the learner seat's first chat (system
    prompt, first observation), ``tools_kwargs`` gives the tool the row's seed."""
    return asyncio.run(dataset_rows_async(config, episodes, seed))


async def dataset_rows_async(
    config: ParleyToolConfig | Mapping[str, Any], episodes: int, seed: int = 0
) -> list[dict[str, Any]]:
    """:func:`dataset_rows` from a running event loop."""
    settings = (
        config if isinstance(config, ParleyToolConfig) else ParleyToolConfig.from_verl(config)
    )
    rows = []
    async with settings.arena() as arena:
        run = RunConfig(scenario=settings.scenario, episodes=episodes, seed=seed)
        for index, plan in enumerate(plan_episodes(run, arena.seats)):
            session = arena.session()
            try:
                turn = await session.reset(seed=plan.seed)
            finally:
                await session.close()
            if turn.done:
                raise ConfigError(
                    f"{settings.scenario} seed {plan.seed}: the learner seat never acts "
                    f"({turn.failed or 'the episode ended first'})"
                )
            rows.append(
                {
                    "data_source": f"parley/{settings.scenario}",
                    "agent_name": "tool_agent",
                    "prompt": turn.messages,
                    "reward_model": {"style": "rule", "ground_truth": ""},
                    "extra_info": {
                        "index": index,
                        "seed": plan.seed,
                        "need_tools_kwargs": True,
                        "tools_kwargs": {settings.name: {"create_kwargs": {"seed": plan.seed}}},
                    },
                }
            )
    return rows
