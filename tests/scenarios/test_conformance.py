"""The conformance suite over every registered scenario, one test per (scenario, check)."""

from __future__ import annotations

import warnings

import pytest

from parley.scenarios import registry
from parley.scenarios.conformance import CHECKS, NotApplicable

# Scenarios that other test modules register for their own use (entry points in ``tests.``)
# are fixtures, not part of the library; whether they are collected first depends on order.
SCENARIOS = sorted(
    scenario_id
    for scenario_id, scenario in registry().items()
    if not scenario.entry_point.startswith("tests.")
)


# code/debug's hostile check sends never-ending programs through every tool and submits one:
# ~26 s per version (sandbox time budgets and the hidden run's limit), so it runs as slow.
_SLOW = {(f"code/debug-v{v}", "hostile") for v in range(4)}
_CASES = [
    pytest.param(s, c, marks=[pytest.mark.slow] if (s, c) in _SLOW else [], id=f"{s}-{c}")
    for s in SCENARIOS
    for c in sorted(CHECKS)
]


@pytest.mark.parametrize(("scenario_id", "check"), _CASES)
def test_conformance(scenario_id: str, check: str) -> None:
    with warnings.catch_warnings():
        # pettingzoo's tests warn about non-array states and similar: expected for text envs.
        warnings.simplefilter("ignore")
        try:
            CHECKS[check](scenario_id)
        except NotApplicable as why:
            pytest.skip(str(why))


def test_the_aec_api_test_trap_is_still_there() -> None:
    """The suite documents that PettingZoo's AEC ``api_test`` cannot take ``Text`` spaces and
    uses the parallel test instead; this fails (and the docs need updating) once it can."""
    from pettingzoo.test import api_test
    from pettingzoo.utils.conversions import parallel_to_aec

    from parley.scenarios import make
    from parley.scenarios.conformance import __doc__ as suite_doc

    assert suite_doc is not None
    assert "``api_test`` crashes on ``Text`` spaces" in suite_doc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(AttributeError, match="dtype"):
            api_test(parallel_to_aec(make("negotiation/simple-trade-v1")), num_cycles=5)
