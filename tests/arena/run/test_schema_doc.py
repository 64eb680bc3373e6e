"""arena/run/SCHEMA.md says what the code writes: its failure kinds are the summary's, and
an agent whose ``act`` returns something other than an ``Action`` fails its episode with the
kind the document gives for it (issue 14)."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.agents.base import Agent
from parley.arena.run.config import RunConfig
from parley.arena.run.runner import run
from parley.arena.run.summary import FAILURE_KINDS
from parley.protocols.messages import Observation

SCHEMA = Path(__file__).parents[3] / "arena" / "run" / "SCHEMA.md"


def _kinds_table() -> dict[str, str]:
    text = SCHEMA.read_text()
    section = text[text.index("### Failed episodes") : text.index("## `trajectories.jsonl`")]
    return dict(re.findall(r"^\| `([a-z_]+)`\s*\| (.+?) \|$", section, flags=re.MULTILINE))


def test_schema_lists_exactly_the_failure_kinds() -> None:
    assert set(_kinds_table()) == set(FAILURE_KINDS)


class ReturnsText(Agent):
    async def act(self, observation: Observation) -> str:  # type: ignore[override]
        return "a plain string"


@pytest.fixture
def module() -> Iterator[str]:
    mod = types.ModuleType("parley_test_schema_agents")
    mod.ReturnsText = ReturnsText  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    yield mod.__name__
    del sys.modules[mod.__name__]


@pytest.mark.parametrize("over_bus", [False, True], ids=["direct", "bus"])
def test_non_action_reply_is_the_documented_kind(module: str, over_bus: bool) -> None:
    config = RunConfig(
        scenario="negotiation/deal-or-no-deal-v1",
        agents=[f"{module}:ReturnsText", "scripted"],
        episodes=1,
        progress=False,
        local_agents_over_bus=over_bus,
    )
    (failure,) = run(config).summary["failures"]
    seat, kind, detail = (part.strip() for part in failure["reason"].split(":", 2))
    assert (seat, kind) == ("player_0", "agent_error")
    assert "not an Action" in detail
    assert "returned something other than an `Action`" in _kinds_table()[kind]
