"""``llm:PATH?key=value`` parsing."""

from __future__ import annotations

import pytest

from parley.arena.inference.llm_spec import parse_llm_spec
from parley.protocols.errors import ConfigError


def test_query_keys_reach_agent_and_pool_configs() -> None:
    spec = parse_llm_spec("models/tiny?temperature=0.5&max_tokens=8&max_batch_size=4")
    assert spec.model == "models/tiny"
    assert spec.agent.temperature == 0.5
    assert spec.agent.max_tokens == 8
    assert spec.pool.max_batch_size == 4
    assert spec.system_prompt is True


def test_system_prompt_none_sends_none() -> None:
    assert parse_llm_spec("m?system_prompt=none").system_prompt is False
    assert parse_llm_spec("m?system_prompt=scenario").system_prompt is True
    with pytest.raises(ConfigError, match="use scenario or none"):
        parse_llm_spec("m?system_prompt=maybe")


def test_unknown_keys_are_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="known keys"):
        parse_llm_spec("m?temprature=1")
