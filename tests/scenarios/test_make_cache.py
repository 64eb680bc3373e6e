"""make() resolves an entry point once (issue 11 §5) and still follows the registry: a
re-registered id makes its new class, spec kwargs still apply and are overridden by the
caller's, every call makes a fresh instance, and an entry point that cannot be loaded keeps
failing with its error (nothing is cached for it)."""

from __future__ import annotations

import importlib

import pytest

from parley.protocols.errors import ConfigError
from parley.scenarios import make, register
from parley.scenarios.negotiation.simple_trade import SimpleTradeV0
from parley.scenarios.negotiation.split_the_pie import SplitThePieV0

# (the module: parley.scenarios.registry the attribute is the registry() function)
reg = importlib.import_module("parley.scenarios.registry")


def test_make_follows_re_registration_and_kwargs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reg, "_REGISTRY", dict(reg._REGISTRY))
    register("test/cached-v0", "parley.scenarios.negotiation.simple_trade:SimpleTradeV0")
    first, second = make("test/cached-v0"), make("test/cached-v0", max_turns=4)
    assert type(first) is SimpleTradeV0
    assert first is not second
    assert (first.max_turns, second.max_turns) == (10, 4)
    register(
        "test/cached-v0",
        "parley.scenarios.negotiation.split_the_pie:SplitThePieV0",
        override=True,
    )
    assert type(make("test/cached-v0")) is SplitThePieV0
    register(
        "test/cached-v0",
        "parley.scenarios.negotiation.simple_trade:SimpleTradeV0",
        kwargs={"max_turns": 6},
        override=True,
    )
    assert make("test/cached-v0").max_turns == 6
    assert make("test/cached-v0", max_turns=2).max_turns == 2


def test_an_entry_point_that_does_not_load_fails_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reg, "_REGISTRY", dict(reg._REGISTRY))
    register("test/missing-v0", "parley.scenarios.negotiation.simple_trade:NoSuchGame")
    for _ in range(2):
        with pytest.raises(ConfigError, match="no attribute"):
            make("test/missing-v0")
    assert "parley.scenarios.negotiation.simple_trade:NoSuchGame" not in reg._CLASSES
