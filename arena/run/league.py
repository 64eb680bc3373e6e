"""Tournaments: agents play each other over scenarios; a cross-play matrix and ratings.

A league plays **matches**: one scenario, one seat arrangement of two agents (agent A in one
seat, agent B in every other seat), ``games_per_pair`` episodes. Every pairing is played in
every arrangement (both sides of an asymmetric game), and every match is one
:class:`~parley.arena.run.config.RunConfig` run with the league's seed, so game ``g`` of
every match replays the same deal (the runner derives episode seeds from the run seed
only): as in duplicate bridge, deal luck cancels out of every comparison.

Schedules: ``round-robin`` (every pair) or ``swiss`` (``rounds`` rounds; each round pairs
agents of close standing that have not met; for many agents). Each match writes its run
folder under ``OUT/matches/KEY/`` and then ``result.json``; a league started again with the
same settings skips every match that has its ``result.json`` (resume after a crash or a
Ctrl-C), unless one of its agents changed in place since: ``result.json`` records each
agent's fingerprint (:func:`~parley.arena.run.agent_specs.agent_fingerprint`: an ``llm:PATH``
model folder's files, a ``module:Class``'s source file), and a match whose agent's
fingerprint differs now is played again (one log line per changed agent). An agent that
changed while the league played is recorded so that the next run plays it again; a model
folder that is gone is an error. ``ray`` plays each match's episodes on Ray
(``RunConfig.ray``).

Scoring: in a finished episode an agent's score is the mean return of its seats; the agent
with the higher score wins, equal scores are a draw. An episode that failed because of one
agent's seats alone (its agent raised, returned something other than an action, did not
answer within ``act_timeout``, died or never joined) is that agent's **forfeit**: a loss in
the matrix and the ratings, and no score (so an agent cannot escape a lost game by crashing
or stalling in it). Other failed episodes (the scenario raised, no end within ``max_steps``,
both agents failed, the bus failed) are not scored; each agent's count of them is in
``unscored``.
Outputs (``OUT/league.json``, :func:`standings`):

* ``matrix`` — for each ordered pair, the row agent's win rate (draws count half) against the
  column agent, games, and a 95% Wilson interval;
* ``ratings`` — Bradley-Terry strengths fitted by maximum likelihood (draws as half a win
  each way, a weak ridge prior so unbeaten agents stay finite), on the Elo scale
  (400 log10, mean 1000), with 95% intervals from a seeded bootstrap over games;
* ``openskill`` — Weng-Lin (openskill's Plackett-Luce) ratings updated game by game in play
  order, ``mu`` with ``mu +- 2 sigma`` (present when openskill is installed: the ``games``
  extra);
* ``scenarios`` — per scenario and agent: games, mean score with a 95% interval (over the
  games it did not forfeit), win rate, forfeits;
* ``unscored`` — per agent, its failed episodes that no single agent forfeited.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from parley.arena.run.backpressure import failed_seats
from parley.protocols.errors import ConfigError

__all__ = [
    "LeagueConfig",
    "play_league",
]

SCHEDULES = ("round-robin", "swiss")
SCORING = 2
"""Version of a match's scoring in its ``result.json``; a match scored by another version is
scored again from its transcripts when the league resumes (1: failed episodes unscored)."""
DEFAULT_ACT_TIMEOUT = 60.0


@dataclasses.dataclass
class LeagueConfig:
    """What a league plays; validated at construction."""

    agents: dict[str, str]
    """Agent name -> agent spec (``scripted``, ``module:Class``, ``llm:...``: any
    ``parley run --agents`` spec), at least two."""
    scenarios: list[str]
    """Scenario ids (registered or imported, ``openspiel:kuhn_poker``)."""
    out: str
    """Folder of the league: ``league.json`` and one run folder per match."""
    games_per_pair: int = 10
    """Episodes of each match (each pairing x scenario x seat arrangement)."""
    seed: int = 0
    """Run seed of every match: game g of every match is the same deal."""
    schedule: str = "round-robin"
    """``round-robin`` or ``swiss``."""
    rounds: int = 0
    """Swiss rounds; 0 means ceil(log2(agents)) + 1."""
    concurrency: int = 8
    """Episodes at once within a match (``RunConfig.concurrency``)."""
    ray: str | None = None
    """Play each match on Ray (``RunConfig.ray``: ``local``, ``auto``, an address)."""
    bootstrap: int = 200
    """Bootstrap resamples for the rating intervals."""
    act_timeout: float = DEFAULT_ACT_TIMEOUT
    """Seconds an agent has to answer (``RunConfig.act_timeout``); past it, it forfeits."""

    def __post_init__(self) -> None:
        if len(self.agents) < 2:
            raise ConfigError("a tournament needs at least two agents (--agents A,B,...)")
        if not self.scenarios:
            raise ConfigError("a tournament needs at least one scenario (--scenarios S1,...)")
        if self.games_per_pair < 1:
            raise ConfigError(f"games_per_pair must be >= 1, got {self.games_per_pair}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.rounds < 0:
            raise ConfigError(f"rounds must be >= 0, got {self.rounds}")
        if not self.act_timeout > 0:
            raise ConfigError(f"act_timeout must be > 0 seconds, got {self.act_timeout}")
        for name, spec in self.agents.items():
            if spec.strip().partition(":")[0] == "remote":
                # (each match binds its own private address: no remote agent could join,
                # and every game would wait out join_timeout)
                raise ConfigError(
                    f"agent {name!r}: {spec!r} plays from another process, and a tournament "
                    "hosts its agents in-process (its matches' buses are private); give a "
                    "module:Class, file.py:Class, scripted or llm:PATH spec, or play remote "
                    "agents with parley run --listen"
                )


@dataclasses.dataclass(frozen=True)
class Match:
    """One scenario, one seat arrangement of two agents."""

    scenario: str
    seats: tuple[tuple[str, str], ...]
    """(seat, agent name) for every seat, in the scenario's seat order."""

    @property
    def agents(self) -> tuple[str, str]:
        """The two agents, the one alone in its seat first."""
        names = [name for _, name in self.seats]
        lone = next(n for n in names if names.count(n) == 1 or len(set(names)) == 1)
        other = next((n for n in names if n != lone), lone)
        return lone, other

    def key(self, config: LeagueConfig) -> str:
        """The match's folder name: readable, and a digest of everything that decides it."""
        decided = [self.scenario, self.seats, config.games_per_pair, config.seed]
        decided.append({name: config.agents[name] for _, name in self.seats})
        if config.act_timeout != DEFAULT_ACT_TIMEOUT:  # (folders of default leagues unchanged)
            decided.append(config.act_timeout)
        digest = hashlib.sha256(json.dumps(decided, sort_keys=True).encode()).hexdigest()[:12]
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in self.scenario)
        return f"{safe}--{'-'.join(name for _, name in self.seats)}--{digest}"[:160]


@dataclasses.dataclass(frozen=True)
class Game:
    """One scored episode between two agents."""

    scenario: str
    episode: str
    seed: int
    agents: tuple[str, str]
    scores: tuple[float, float]
    """Mean return of each agent's seats (0, 0 in a forfeit: not a score)."""
    run: str
    """The match folder (relative to the league's ``out``)."""
    forfeit: str = ""
    """The agent that forfeited the game by failing it (module docstring), or ""."""

    @property
    def outcome(self) -> float:
        """1 when the first agent won, 0.5 for a draw, 0 when it lost."""
        if self.forfeit:
            return 0.0 if self.forfeit == self.agents[0] else 1.0
        a, b = self.scores
        return 1.0 if a > b + 1e-9 else 0.0 if b > a + 1e-9 else 0.5


# --- schedules ---------------------------------------------------------------------------


def arrangements(seats: Sequence[str], a: str, b: str) -> list[Match]:
    """Every arrangement of ``a`` and ``b`` over ``seats``: ``a`` alone in each seat with
    ``b`` in the others, then ``b`` alone in each (for two seats: both sides)."""
    out = []
    for lone, other in ((a, b), (b, a)):
        for seat in seats:
            out.append(tuple((s, lone if s == seat else other) for s in seats))
    unique = list(dict.fromkeys(out))  # two seats: "a alone in 0" == "b alone in 1"
    return [Match("", arrangement) for arrangement in unique]


def schedule_round_robin(names: Sequence[str]) -> list[tuple[str, str]]:
    """Every unordered pair of ``names``, in a fixed order."""
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


def swiss_pairs(
    names: Sequence[str], points: dict[str, float], met: set[frozenset[str]]
) -> list[tuple[str, str]]:
    """One Swiss round: agents sorted by points (then name), each paired with the next one
    below it that it has not met (or, when it has met them all, the next one); with an odd
    number the last agent sits out."""
    order = sorted(names, key=lambda n: (-points.get(n, 0.0), n))
    pairs = []
    while len(order) > 1:
        first = order.pop(0)
        pick = next((n for n in order if frozenset((first, n)) not in met), order[0])
        order.remove(pick)
        pairs.append((first, pick))
    return pairs


# --- playing ------------------------------------------------------------------------------


def _seats(scenario: str) -> list[str]:
    from parley.scenarios import make

    env = make(scenario)
    return list(env.possible_agents)


Prints = dict[str, dict[str, str]]
"""Agent name -> :func:`~parley.arena.run.agent_specs.agent_fingerprint` in one scenario."""


def fingerprints(
    config: LeagueConfig, scenario: str, seats: Sequence[str], names: Iterable[str] = ()
) -> Prints:
    """The fingerprints of ``names`` (default: every agent) for ``scenario``; taken when the
    league starts, which imports the agents' classes: the code a match plays is the code
    fingerprinted (a process imports a module once)."""
    from parley.arena.run.agent_specs import agent_fingerprint
    from parley.arena.run.runner import _baseline

    baselines = [_baseline(scenario, seat) for seat in seats]
    return {
        name: agent_fingerprint(config.agents[name], baselines) for name in names or config.agents
    }


def _changed(match: Match, recorded: Prints, prints: Prints) -> list[str]:
    """The agents of ``match`` whose fingerprint differs from the one its result recorded;
    a model folder that was there and is gone is an error, not a change."""
    changed = []
    for name in match.agents:
        before, now = recorded.get(name), prints[name]
        for key in ("model", "adapter"):
            if before and f"{key}_folder" in before and f"{key}_folder" not in now:
                raise ConfigError(
                    f"agent {name!r}: its {key} folder {before[f'{key}_folder']!r} is gone (its "
                    "matches were played with it); restore it, or give the league a new --out"
                )
        if before != now:
            changed.append(name)
    return changed


def play_match(
    config: LeagueConfig,
    match: Match,
    *,
    log: Callable[[str], None],
    prints: Prints | None = None,
    announced: set[str] | None = None,
) -> tuple[list[Game], int]:
    """Play ``match`` (or read it back when its ``result.json`` exists and its agents'
    fingerprints in ``prints`` are the ones it recorded) and score it: its games, and how
    many of its episodes failed unscored. ``announced``: agents already said to have
    changed (one line per agent, not per match)."""
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import run

    folder = Path(config.out) / "matches" / match.key(config)
    result = folder / "result.json"
    if prints is None:
        prints = fingerprints(config, match.scenario, [s for s, _ in match.seats], match.agents)
    announced = set() if announced is None else announced
    done = json.loads(result.read_text()) if result.exists() else None
    changed = _changed(match, done.get("fingerprints", prints), prints) if done else []
    for name in changed:
        if name not in announced:
            announced.add(name)
            log(f"agent {name} changed since its matches were played: playing them again")
    if done and not changed:
        if done.get("scoring") == SCORING and "fingerprints" in done:
            log(f"resumed {folder.name}")
            return [_game(row) for row in done["games"]], int(done["unscored"])
        # (its run is whole: result.json came after it; a result from before fingerprints
        # were kept is taken as played by the agents there now)
        log(f"scoring again {folder.name}")
    else:
        result.unlink(missing_ok=True)  # (a crash while replaying leaves the match unplayed)
        run_config = RunConfig(
            scenario=match.scenario,
            agents={seat: config.agents[name] for seat, name in match.seats},
            episodes=config.games_per_pair,
            seed=config.seed,
            concurrency=config.concurrency,
            out=str(folder),
            progress=False,
            ray=config.ray,
            max_failed_fraction=1.0,
            act_timeout=config.act_timeout,
        )
        if config.ray is None:
            run(run_config)
        else:  # (plain run() ignores RunConfig.ray: the Ray runner is its own class)
            from parley.arena.run.ray_runner import run_on_ray

            run_on_ray(run_config)
    games, unscored = _score(match, folder, config.out)
    rows = [dataclasses.asdict(game) for game in games]
    recorded = {name: prints[name] for name in match.agents}
    after = fingerprints(config, match.scenario, [s for s, _ in match.seats], match.agents)
    for name, now in after.items():  # (an agent changed while it played: replay it next time)
        if now != prints[name]:
            recorded[name] = {**prints[name], "changed_while_played": "true"}  # (never equal)
            log(f"agent {name} changed while {folder.name} was played: it plays again when "
                "the league is next run")  # fmt: skip
    tmp = result.with_suffix(".tmp")
    done = {"match": dataclasses.asdict(match), "games": rows, "unscored": unscored}
    done["fingerprints"] = recorded
    tmp.write_text(json.dumps({**done, "scoring": SCORING}, indent=1))
    os.replace(tmp, result)  # the match counts as played only once this file is whole
    forfeits = sum(bool(game.forfeit) for game in games)
    log(
        f"played {folder.name}: {len(games)} scored of {config.games_per_pair}"
        f" ({forfeits} forfeited, {unscored} failed unscored)"
    )
    return games, unscored


def _game(row: dict[str, Any]) -> Game:
    return Game(
        row["scenario"], row["episode"], int(row["seed"]), tuple(row["agents"]),
        tuple(row["scores"]), row["run"], row["forfeit"],
    )  # fmt: skip


def _score(match: Match, folder: Path, out: str) -> tuple[list[Game], int]:
    """The games of ``match``'s transcripts and the number of its failed episodes that no
    single agent forfeited."""
    a, b = match.agents
    owner = dict(match.seats)
    run = str(folder.relative_to(out))
    games, unscored = [], 0
    with open(folder / "transcripts.jsonl", encoding="utf-8") as lines:
        for line in lines:
            episode = json.loads(line)
            scores, forfeit = (0.0, 0.0), ""
            if episode["status"] != "ok":
                culprits = {owner[seat] for seat in failed_seats(episode["failed"], owner) or ()}
                if len(culprits) != 1:  # not one agent's doing
                    unscored += 1
                    continue
                forfeit = culprits.pop()
            else:
                returns = episode["returns"]
                scores = tuple(  # type: ignore[assignment]
                    float(np.mean([returns[s] for s in owner if owner[s] == name]))
                    for name in (a, b)
                )
            games.append(
                Game(match.scenario, episode["episode"], int(episode["seed"]), (a, b), scores,
                     run, forfeit)
            )  # fmt: skip
    return games, unscored


def play_league(
    config: LeagueConfig,
    *,
    log: Callable[[str], None] = lambda line: None,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> dict[str, Any]:
    """Play (or resume) the whole league; writes and returns ``league.json``'s content.

    ``progress(done, total)`` is called with the games planned (``total``) before the first
    match and after every match, played or resumed (``done``: games of the matches so far)."""
    names = list(config.agents)
    seats = {scenario: _seats(scenario) for scenario in config.scenarios}
    prints = {s: fingerprints(config, s, seats[s]) for s in config.scenarios}
    announced: set[str] = set()
    games: list[Game] = []
    unscored = dict.fromkeys(names, 0)
    rounds = config.rounds or math.ceil(math.log2(len(names))) + 1
    pairs_planned = (
        len(names) * (len(names) - 1) // 2
        if config.schedule == "round-robin"
        else rounds * (len(names) // 2)
    )
    per_pair = sum(len(arrangements(seats[s], "a", "b")) for s in config.scenarios)
    total = pairs_planned * per_pair * config.games_per_pair
    done = 0
    progress(done, total)

    def play_pairs(pairs: Iterable[tuple[str, str]]) -> None:
        nonlocal done
        for a, b in pairs:
            for scenario in config.scenarios:
                for arranged in arrangements(seats[scenario], a, b):
                    match = dataclasses.replace(arranged, scenario=scenario)
                    played, failed = play_match(
                        config, match, log=log, prints=prints[scenario], announced=announced
                    )
                    games.extend(played)
                    unscored[a] += failed
                    unscored[b] += failed
                    done += config.games_per_pair
                    progress(done, total)

    if config.schedule == "round-robin":
        play_pairs(schedule_round_robin(names))
    else:
        met: set[frozenset[str]] = set()
        for _ in range(rounds):
            pairs = swiss_pairs(names, _points(games), met)
            met.update(frozenset(pair) for pair in pairs)
            play_pairs(pairs)
    log(f"rating {len(games)} games")
    table = standings(games, names, bootstrap=config.bootstrap, seed=config.seed)
    table["unscored"] = unscored
    table["config"] = dataclasses.asdict(config)
    Path(config.out).mkdir(parents=True, exist_ok=True)
    tmp = Path(config.out) / "league.json.tmp"
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    os.replace(tmp, Path(config.out) / "league.json")
    return table


def _points(games: Iterable[Game]) -> dict[str, float]:
    points: dict[str, float] = {}
    for game in games:
        a, b = game.agents
        points[a] = points.get(a, 0.0) + game.outcome
        points[b] = points.get(b, 0.0) + 1.0 - game.outcome
    return points


# --- statistics ---------------------------------------------------------------------------


def wilson(wins: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``wins / n``."""
    if n == 0:
        return 0.0, 1.0
    p = wins / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bradley_terry(
    pairs: np.ndarray, outcomes: np.ndarray, n: int, ridge: float = 0.01
) -> np.ndarray:
    """Bradley-Terry log-strengths (mean 0) by Newton's method.

    ``pairs`` (G, 2) agent indices, ``outcomes`` (G,) 1/0.5/0 for the first agent; ``ridge``
    is a Gaussian prior's precision that keeps an unbeaten agent's strength finite.
    """
    beta = np.zeros(n)
    i, j = pairs[:, 0], pairs[:, 1]
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(beta[j] - beta[i]))  # (G,) P(first wins)
        residual = outcomes - p
        grad = np.bincount(i, residual, n) - np.bincount(j, residual, n) - ridge * beta
        w = p * (1 - p)
        hess = -ridge * np.eye(n)
        np.add.at(hess, (i, i), -w)
        np.add.at(hess, (j, j), -w)
        np.add.at(hess, (i, j), w)
        np.add.at(hess, (j, i), w)
        step = np.linalg.solve(hess, -grad)
        beta += step
        if np.max(np.abs(step)) < 1e-9:
            break
    centred: np.ndarray = beta - beta.mean()
    return centred


def standings(
    games: Sequence[Game], names: Sequence[str], *, bootstrap: int = 200, seed: int = 0
) -> dict[str, Any]:
    """The cross-play matrix, ratings and per-scenario table of ``games`` (module docstring)."""
    index = {name: k for k, name in enumerate(names)}
    matrix: dict[str, dict[str, Any]] = {a: {} for a in names}
    for a in names:
        for b in names:
            if a == b:
                continue
            wins = [g.outcome if g.agents[0] == a else 1 - g.outcome for g in games
                    if set(g.agents) == {a, b}]  # fmt: skip
            low, high = wilson(sum(wins), len(wins))
            rate = sum(wins) / len(wins) if wins else None
            matrix[a][b] = {"win_rate": rate, "games": len(wins), "ci": [low, high]}
    ratings = _ratings(games, names, index, bootstrap, seed)
    per_scenario: dict[str, dict[str, Any]] = {}
    for scenario in dict.fromkeys(g.scenario for g in games):
        rows = per_scenario[scenario] = {}
        for name in names:
            scores, wins, forfeits = [], [], 0
            for g in games:
                if g.scenario == scenario and name in g.agents:
                    first = g.agents[0] == name
                    wins.append(g.outcome if first else 1 - g.outcome)
                    if g.forfeit:  # (a forfeit has no scores)
                        forfeits += g.forfeit == name
                    else:
                        scores.append(g.scores[0 if first else 1])
            if wins:
                half = (
                    1.96 * float(np.std(scores, ddof=1)) / math.sqrt(len(scores))
                    if len(scores) > 1
                    else None
                )
                rows[name] = {
                    "games": len(wins),
                    "mean_score": float(np.mean(scores)) if scores else None,
                    "ci": half,
                    "win_rate": float(np.mean(wins)),
                    "forfeits": forfeits,
                }
    table = {
        "agents": list(names),
        "games": [dataclasses.asdict(g) for g in games],
        "matrix": matrix,
        "ratings": ratings,
        "scenarios": per_scenario,
    }
    skill = openskill_ratings(games, names)
    if skill is not None:
        table["openskill"] = skill
    return table


def openskill_ratings(games: Sequence[Game], names: Sequence[str]) -> list[dict[str, Any]] | None:
    """Weng-Lin ratings (openskill's Plackett-Luce model, its defaults) updated one game at
    a time in play order, best ``mu`` first; ``None`` when openskill is not installed."""
    try:
        from openskill.models import PlackettLuce
    except ImportError:
        return None
    model = PlackettLuce()
    current = {name: model.rating(name=name) for name in names}
    for game in games:
        a, b = game.agents
        ranks = {1.0: [0.0, 1.0], 0.0: [1.0, 0.0]}.get(game.outcome, [0.0, 0.0])
        [[current[a]], [current[b]]] = model.rate([[current[a]], [current[b]]], ranks=ranks)
    rows = [
        {"agent": name, "mu": float(r.mu), "sigma": float(r.sigma),
         "ci": [float(r.mu - 2 * r.sigma), float(r.mu + 2 * r.sigma)]}
        for name, r in current.items()
    ]  # fmt: skip
    return sorted(rows, key=lambda row: -row["mu"])


def _ratings(
    games: Sequence[Game], names: Sequence[str], index: dict[str, int], bootstrap: int, seed: int
) -> list[dict[str, Any]]:
    if not games:
        return [{"agent": n, "rating": None, "ci": None, "games": 0} for n in names]
    pairs = np.array([[index[g.agents[0]], index[g.agents[1]]] for g in games])
    outcomes = np.array([g.outcome for g in games])
    scale = 400 / math.log(10)  # Elo points per unit of log-strength
    point = 1000 + scale * bradley_terry(pairs, outcomes, len(names))
    rng = np.random.default_rng(seed)
    draws = np.empty((bootstrap, len(names)))
    for k in range(bootstrap):
        pick = rng.integers(len(games), size=len(games))
        draws[k] = 1000 + scale * bradley_terry(pairs[pick], outcomes[pick], len(names))
    low, high = np.percentile(draws, [2.5, 97.5], axis=0)
    played = np.bincount(pairs.ravel(), minlength=len(names))
    rows = [
        {"agent": name, "rating": float(point[k]), "ci": [float(low[k]), float(high[k])],
         "games": int(played[k])}
        for k, name in enumerate(names)
    ]  # fmt: skip
    return sorted(rows, key=lambda row: -row["rating"])
