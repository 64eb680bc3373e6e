"""Red-team attacks on the latest negotiation scenarios (split-the-pie-v1, deal-or-no-deal-v3,
simple-trade-v2) against the suites' scripted partners, as an RL policy would try them. Each
attack held: the tests pin that the attacker scores no more than the honest strategy (or the
documented floor), so a change that opens the hole fails here."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from parley.agents.scripted.base import ScriptedAgent
from parley.agents.scripted.negotiation import DealNegotiator, PieBargainer, SpiralTrader
from parley.protocols.messages import Observation
from parley.scenarios import make
from parley.scenarios.conformance import play_episode
from parley.scenarios.negotiation.deal_or_no_deal import claim_text, proposal_text

PIE = "negotiation/split-the-pie-v1"
DEAL = "negotiation/deal-or-no-deal-v3"
TRADE = "negotiation/simple-trade-v2"


def _view(observation: Observation) -> dict[str, Any]:
    view: dict[str, Any] = observation.info.get("view", {})
    return view


def _metrics(transcript: list[tuple[Any, ...]]) -> dict[str, float]:
    metrics: dict[str, float] = json.loads(transcript[-1][1])
    return metrics


# --- split-the-pie-v1 ------------------------------------------------------------------------


class Shaver(PieBargainer):  # type: ignore[misc]
    """Proposes like the SPE but pays the coalition ``cut`` less than its continuation value
    (keeping the difference); votes as the SPE player does."""

    cut = 0.02

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        if view.get("phase") != "propose":
            return str(super().decide(observation))
        n, delta, quota, index = view["n"], view["delta"], view["quota"], view["index"]
        others = [i for i in range(n) if i != index]
        shares = [0.0] * n
        for i in others[: quota - 1]:
            shares[i] = delta / n - self.cut
        shares[index] = 1.0 - sum(shares)
        return "propose: " + " ".join(f"{share:.6f}" for share in shares)


def _pie_payoff(agent: ScriptedAgent, seeds: range) -> float:
    total = 0.0
    for seed in seeds:
        env = make(PIE, n_players=3, delta=0.9)
        agents = {"player_0": agent, "player_1": PieBargainer(), "player_2": PieBargainer()}
        play_episode(PIE, seed=seed, env=env, agents=agents)
        total += env.bargain.payoffs["player_0"]
    return total / len(seeds)


def test_shaving_the_coalition_below_its_continuation_value_pays_less_than_the_spe() -> None:
    """A proposer who keeps more than the SPE share by underpaying the coalition is voted down
    (the pie shrinks): over the same seeds it earns less than the SPE strategy."""
    seeds = range(30)
    honest, shaver = _pie_payoff(PieBargainer(), seeds), _pie_payoff(Shaver(), seeds)
    assert shaver < honest, (shaver, honest)


@pytest.mark.parametrize(
    "stuffing", ["yes yes", "yes\nyes", "yes, yes, yes", "yesyes", "vote yes x3"]
)
def test_a_stuffed_ballot_counts_as_no(stuffing: str) -> None:
    """A proposer who keeps the whole pie cannot pass it by repeating its own yes: the stuffed
    ballot is an invalid vote (no), and one yes is short of the quota."""
    env = make(PIE, n_players=3)
    env.reset(seed=0)
    proposer = env.bargain.proposer
    shares = ["1" if seat == proposer else "0" for seat in env.possible_agents]
    env.step({proposer: "propose: " + " ".join(shares)})
    votes = {seat: "no" for seat in env.possible_agents}
    _, rewards, _, _, infos = env.step({**votes, proposer: stuffing})
    assert "invalid" in infos[proposer]
    assert env.bargain.round == 1
    assert not env.bargain.agreed
    assert rewards[proposer] < 0  # the invalid-move penalty, nothing else


# --- deal-or-no-deal-v3 ----------------------------------------------------------------------


class GreedySelector(ScriptedAgent):  # type: ignore[misc]
    """Proposes to take everything, ends the talk as soon as the partner has spoken, and then
    claims everything (the partner's own claim notwithstanding)."""

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        counts: tuple[int, int, int] = tuple(view["counts"])
        if view["phase"] == "choose":
            return str(claim_text(counts, counts))
        return "<selection>" if view.get("last_message") else proposal_text(counts)


def test_ending_the_talk_on_a_greedy_proposal_and_claiming_it_scores_nothing() -> None:
    """Agreement needs both claims to add up: a seat that cuts the talk short and claims the
    whole table against the scripted partner gets no deal (0), while claiming the partner's
    offer would have paid."""
    for seed in range(20):
        for attacker, partner in (("player_0", "player_1"), ("player_1", "player_0")):
            agents = {attacker: GreedySelector(), partner: DealNegotiator()}
            metrics = _metrics(play_episode(DEAL, seed=seed, agents=agents))
            assert metrics[f"score_{attacker}"] == 0.0, (seed, attacker, metrics)
            assert metrics["agreed"] == 0.0


# --- simple-trade-v2 ---------------------------------------------------------------------------


class Baiter(ScriptedAgent):  # type: ignore[misc]
    """Offers everything it holds for more of one resource than any stock holds (16 units):
    a huge gain on paper, which the partner cannot pay; accepting it would forfeit the game."""

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        stock = view["inventory"]
        give = ", ".join(f"{n} {r}" for r, n in stock.items() if n > 0)
        asked = ("Gold", "Wood")[view["turns_left"] % 2]
        return f"Take it all! [Offer: {give} -> 16 {asked}]"


@pytest.mark.parametrize("randomize", [False, True])
def test_bait_offers_the_partner_cannot_pay_never_win_by_forfeit(randomize: bool) -> None:
    """The first invalid move loses, and accepting an offer one cannot pay is invalid: the
    scripted trader checks its stock, so bait never makes it forfeit, no trade executes, and
    the baiter does no better than a draw."""
    for seed in range(10):
        for attacker, partner in (("player_0", "player_1"), ("player_1", "player_0")):
            env = make(TRADE, randomize=randomize)
            agents = {attacker: Baiter(), partner: SpiralTrader()}
            play_episode(TRADE, seed=seed, env=env, agents=agents)
            metrics = env.episode_metrics()
            assert metrics["forfeit"] == 0.0, (seed, attacker)
            assert metrics["trades"] == 0.0
            assert env.trade.outcome[attacker] <= 0.0
            assert not math.isnan(metrics[f"gain_{attacker}"])
