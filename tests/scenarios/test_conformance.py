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


@pytest.mark.parametrize("check", sorted(CHECKS))
@pytest.mark.parametrize("scenario_id", SCENARIOS)
def test_conformance(scenario_id: str, check: str) -> None:
    with warnings.catch_warnings():
        # pettingzoo's tests warn about non-array states and similar: expected for text envs.
        warnings.simplefilter("ignore")
        try:
            CHECKS[check](scenario_id)
        except NotApplicable as why:
            pytest.skip(str(why))
