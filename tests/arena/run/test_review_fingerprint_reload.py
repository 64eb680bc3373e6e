"""Review (H9) of the fingerprint of a class agent: it is taken once per module object
(the code this process loaded), so a module reloaded in place (``importlib.reload``, as a
notebook re-running a league after editing its agent does) kept its first digest: the new
code was recorded as the old, and the matches it played before were resumed, stale."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from parley.arena.run.agent_specs import agent_fingerprint

AGENT = """
from parley.agents.base import Agent
from parley.protocols.messages import Action


class Plays(Agent):
    async def act(self, observation):
        return Action(agent=observation.agent, text={move!r})
"""


def test_a_reloaded_module_is_fingerprinted_again(tmp_path: Path, monkeypatch) -> None:
    name = "parley_review_reload_agent"
    source = tmp_path / f"{name}.py"
    source.write_text(AGENT.format(move="rock"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    spec = f"{name}:Plays"
    first = agent_fingerprint(spec)
    source.write_text(AGENT.format(move="paper"))
    assert agent_fingerprint(spec) == first  # not reloaded: still the code that runs here
    importlib.reload(sys.modules[name])
    reloaded = agent_fingerprint(spec)
    assert reloaded != first
    assert agent_fingerprint(spec) == reloaded
    sys.modules.pop(name, None)
