"""Cache-aware routing on real Ray pool replicas (issue 33 §3): a session's turns land on
one replica, more of each prompt comes from the replicas' prefix caches than with
least-busy routing, and a replica that dies mid-run costs no request.

One local Ray (``num_cpus=2``) and two fronts of two tiny-model replicas each; the workload
is ``parley bench routing``'s (:func:`parley.arena.bench.routing.measure`)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from parley.arena.bench.routing import measure  # noqa: E402
from parley.arena.inference.ray_pool import RayPool, ReplicaSpec  # noqa: E402
from parley.arena.inference.routing import RoutingConfig  # noqa: E402
from parley.protocols.messages import GenerateRequest  # noqa: E402

ARGS = argparse.Namespace(
    episodes=8, turns=4, max_tokens=4, system_tokens=0, user_tokens=24, think_ms=20.0,
    session_keys=False,
)  # fmt: skip
"""No shared system prompt: each session's first turn matches nothing and goes by load, so
both replicas get sessions; then each later turn matches its own session's prefix."""


@pytest.mark.long
@pytest.mark.timeout(300)  # four replicas load the model: ~30 s idle, more at load
def test_sessions_stay_on_their_replica_and_hit_the_cache_more_than_least_busy(
    local_ray: None, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    routed: dict[str, dict[tuple[int, ...], list[int]]] = defaultdict(lambda: defaultdict(list))
    last: dict[tuple[int, ...], GenerateRequest] = {}  # each session's latest request
    pick = RayPool._pick

    def spy(self: RayPool, policy: str, *args: Any) -> int:
        index: int = pick(self, policy, *args)
        episode = tuple(args[0].prompt_token_ids[:24])  # its first turn's tokens
        routed[self.router.config.policy][episode].append(index)
        last[episode] = args[0]
        return index

    monkeypatch.setattr(RayPool, "_pick", spy)
    spec = ReplicaSpec(backend="transformers", model=str(tiny_model_dir),
                       options=(("num_threads", 1),))  # fmt: skip
    # No overload fallback here, so every later turn can follow its session.
    sticky = RoutingConfig(balance_abs_threshold=1_000)
    pools = {
        "cache_aware": RayPool(spec, 2, cpus_per_replica=0.0, routing=sticky, max_replacements=0),
        "least_busy": RayPool(spec, 2, cpus_per_replica=0.0, routing="least_busy"),
    }

    async def scenario() -> dict[str, Any]:
        try:
            runs = {}
            for name, pool in pools.items():
                await pool.start()
                runs[name] = await measure(pool, ARGS, run=0)
            # A replica dies between runs: its sessions go to the survivor, no request lost.
            aware = pools["cache_aware"]
            ray.kill(aware.actors[0], no_restart=True)
            for _ in range(200):  # until it is gone: the front's next call to it fails
                try:
                    ray.get(aware.actors[0].requests.remote(), timeout=5)
                except ray.exceptions.RayActorError:
                    break
            runs["on_0"] = on_0 = next(e for e, r in routed["cache_aware"].items() if r[-1] == 0)
            runs["again"] = await aware.generate(last[on_0])  # its session's last turn again
            runs["after_death"] = await measure(aware, ARGS, run=1)
            runs["dead"], runs["resent"] = set(aware.dead), aware.resent
            runs["held"] = aware.router.held(0)
            return runs
        finally:
            for pool in pools.values():
                await pool.close()

    runs = asyncio.run(scenario())
    expected = ARGS.episodes * ARGS.turns * ARGS.max_tokens  # (max_tokens: no EOS this short)
    assert all(runs[name]["tokens"] == expected for name in ("cache_aware", "after_death"))
    aware, on_0 = routed["cache_aware"], runs["on_0"]
    assert len(aware) == 2 * ARGS.episodes
    first_run = list(aware.values())[: ARGS.episodes]
    after = list(aware.values())[ARGS.episodes :]
    assert all(len(set(replicas[: ARGS.turns])) == 1 for replicas in first_run), first_run
    assert aware[on_0][ARGS.turns :] == [0, 1]  # sent again: to 0, found dead, then to 1
    assert {r[0] for r in first_run} == {0, 1}  # sessions spread by load
    hopped = sum(len(set(r[1:])) > 1 for r in routed["least_busy"].values())

    def hit(run: dict[str, int]) -> float:
        return 1 - run["prefilled_tokens"] / run["prompt_tokens"]

    assert hit(runs["cache_aware"]) > hit(runs["least_busy"]), (runs, hopped)
    assert runs["dead"] == {0}
    assert runs["resent"] == 1  # the request that found replica 0 dead went to replica 1
    assert len(runs["again"].completions[0].token_ids) == ARGS.max_tokens
    assert runs["held"] == 0  # and the router forgot what the dead one held
    assert all(set(r) == {1} for r in after)


@pytest.mark.long
@pytest.mark.timeout(300)
def test_bench_routing_json_has_both_routings_side_by_side(
    local_ray: None, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from parley.arena.cli import main

    argv = ["bench", "routing", "--json", "--model", str(tiny_model_dir), "--episodes", "4"]
    assert main([*argv, "--turns", "3", "--max-tokens", "2", "--repeat", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    for policy in ("cache_aware", "least_busy"):
        assert 0 < result[f"{policy}_hit_rate"] < 1
        assert result[f"{policy}_tokens_per_s"] > 0
        assert sum(result[f"{policy}_requests_per_replica"]) >= 4 * 3  # (and a warm-up)
    for key in ("prefill_ratio_least_busy_vs_cache_aware", "tokens_per_s_ratio_vs_least_busy"):
        assert result[key] > 0
    assert result["cache_aware_routing"]["policy"] == "cache_aware"
    assert len(result["load_avg"]) == 2
