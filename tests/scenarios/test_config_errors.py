"""Bad constructor arguments raise one error type, ConfigError, in every scenario (issue 34 s4).

ConfigError subclasses ValueError, so code that caught the ValueError some scenarios raised
before still catches it.
"""

from __future__ import annotations

from typing import Any

import pytest

from parley.protocols.errors import ConfigError
from parley.scenarios import make

BAD = [
    ("negotiation/deal-or-no-deal-v0", {"max_turns": 0}),
    ("negotiation/deal-or-no-deal-v2", {"moves": "telepathy"}),
    ("negotiation/simple-trade-v0", {"max_turns": 0}),
    ("negotiation/simple-trade-v1", {"max_turns": 0}),
    ("tool_use/calc-chain-v0", {"max_turns": 0}),
    ("tool_use/calc-chain-v1", {"difficulty": "hard"}),
    ("tool_use/retail-desk-v0", {"num_tasks": 0}),
    ("tool_use/retail-desk-v3", {"trespass_penalty": -1.0}),
    ("tool_use/research-team-v0", {"max_turns": 0}),
    ("code/debug-v0", {"max_steps": 0}),
    ("code/debug-v0", {"step_budget_s": 0}),
    ("code/debug-v3", {"task": 0, "difficulty": 1}),
]


@pytest.mark.parametrize(("scenario_id", "kwargs"), BAD)
def test_a_bad_argument_is_a_config_error(scenario_id: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as raised:
        make(scenario_id, **kwargs)
    assert isinstance(raised.value, ValueError)
    assert next(iter(kwargs)) in str(raised.value)
