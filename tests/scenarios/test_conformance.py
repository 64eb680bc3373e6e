"""The conformance suite over every registered scenario, one test per (scenario, check)."""

from __future__ import annotations

import warnings

import pytest

from parley.scenarios import registry
from parley.scenarios.conformance import CHECKS, NotApplicable

SCENARIOS = sorted(registry())


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
