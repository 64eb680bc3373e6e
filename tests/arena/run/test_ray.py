"""Episodes on Ray (issue 15): the same files as a local run, and no episode lost or counted
twice when a worker actor is killed or a whole (simulated) node is removed mid-run.

One real Ray cluster per module (``ray.cluster_utils.Cluster``: a head and two worker nodes
of one CPU each on this machine), so start-up is paid once; the node-removal tests run last.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from parley.agents.base import Agent
from parley.arena.run.agent_specs import SeatContext, resolve_agent_spec
from parley.arena.run.config import RunConfig, load_run_config
from parley.arena.run.runner import Runner, _baseline, run
from parley.protocols.errors import ConfigError, MissingDependency
from parley.protocols.messages import Action, Observation

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from parley.arena.run.ray_runner import RayRunner, run_on_ray  # noqa: E402

SCENARIO = "negotiation/deal-or-no-deal-v0"


class _Slow(Agent):
    """The seat's scripted baseline, 20 ms slower per action (same actions, same seeds)."""

    def __init__(self, make: Any) -> None:
        self.inner = make()

    def reset(self, seed: int | None = None) -> None:
        self.inner.reset(seed)

    async def act(self, observation: Observation) -> Action:
        await asyncio.sleep(0.02)
        return await self.inner.act(observation)


def _slow_agents() -> dict[str, Any]:
    agents = {}
    for seat in Runner(RunConfig(scenario=SCENARIO, progress=False)).seats:
        context = SeatContext(
            scenario=SCENARIO, seat=seat, baseline=_baseline(SCENARIO, seat), options={}
        )
        agents[seat] = functools.partial(_Slow, resolve_agent_spec("scripted", context))
    return agents


@pytest.fixture(scope="module")
def cluster() -> Any:
    fast_health = {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 500,
        "health_check_failure_threshold": 3,
    }
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": fast_health},
    )
    nodes = [c.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    # Test-module classes travel by value: Ray workers need not import tests/.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield c, nodes
    ray.shutdown()
    c.shutdown()


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("transcripts.jsonl", "trajectories.jsonl")}


@pytest.mark.slow
def test_ray_writes_the_files_of_a_local_run(cluster: Any, tmp_path: Path) -> None:
    config = RunConfig(
        scenario=SCENARIO, episodes=12, trials=2, seed=5, concurrency=4, progress=False
    )
    local = run(config.replace(out=str(tmp_path / "local")))
    on_ray = run_on_ray(config.replace(out=str(tmp_path / "ray"), ray="auto", ray_workers=2))
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")
    for key in ("episodes", "metrics", "returns", "pass_hat_k", "agent_steps"):
        assert on_ray.summary[key] == local.summary[key]
    figures = on_ray.summary["ray"]
    assert figures["workers"] == 2
    assert figures["retried"]["episodes"] == 0
    assert sum(node["episodes"] for node in figures["nodes"].values()) == 24
    assert (
        sum(node["agent_steps"] for node in figures["nodes"].values())
        == local.summary["agent_steps"]
    )
    written = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert written["ray"]["nodes"] == figures["nodes"]


@pytest.mark.slow
def test_workers_ship_only_what_the_driver_reads(cluster: Any) -> None:
    """No files and no kept records: workers build and ship no steps (as the local runner
    builds none), the summary is the local one; files only: each transcript travels as the
    JSON line the file holds, byte for byte the local run's."""
    import zlib

    import msgspec

    from parley.arena.run.episode import plan_episodes
    from parley.arena.run.ray_worker import EpisodeWorker
    from parley.arena.run.records import EpisodeRecord, encode_json

    config = RunConfig(scenario=SCENARIO, episodes=6, seed=3, concurrency=3, progress=False)
    local = asyncio.run(Runner(config, keep_records=True).run())
    kept = local.kept_records
    assert kept is not None

    async def shipped() -> tuple[bytes, bytes]:
        worker = EpisodeWorker(config)
        plans = plan_episodes(config, worker.runner.seats)
        try:
            return await worker.play(plans, "none"), await worker.play(plans, "json")
        finally:
            await worker.stop()

    bare, lines = asyncio.run(shipped())
    records = msgspec.msgpack.decode(zlib.decompress(bare), type=list[EpisodeRecord])
    assert all(not r.transcript.get("steps") for r in records)
    assert all(not t.turns for r in records for t in r.trajectories)
    assert [r.metrics for r in records] == [r.metrics for r in kept]
    assert [[t.reward for t in r.trajectories] for r in records] == [
        [t.reward for t in r.trajectories] for r in kept
    ]
    pairs = msgspec.msgpack.decode(zlib.decompress(lines), type=list[tuple[EpisodeRecord, bytes]])
    assert [line for _, line in pairs] == [encode_json(r.transcript) for r in kept]
    assert all(record.transcript == {} for record, _ in pairs)  # not shipped twice
    on_ray = run_on_ray(config.replace(ray="auto", ray_workers=2))
    for key in ("episodes", "metrics", "returns", "agent_steps", "invalid_moves"):
        assert on_ray.summary[key] == local.summary[key]


async def _run_and_break(runner: RayRunner, brk: Any) -> Any:
    """Start ``runner``; once every worker is up and playing, call ``brk(runner)``."""
    task = asyncio.create_task(runner.run())
    deadline = time.monotonic() + 60
    while not (runner.slots and all(s.where and s.in_flight for s in runner.slots)):
        assert time.monotonic() < deadline, "the Ray workers never started"
        assert not task.done(), "the run ended before it could be broken"
        await asyncio.sleep(0.02)
    brk(runner)
    return await asyncio.wait_for(task, timeout=120)


def _check_recovered(result: Any, local: Any, tmp_path: Path) -> None:
    summary = result.summary
    assert summary["episodes"] == {"total": 30, "ok": 30, "failed": 0}
    assert summary["ray"]["retried"]["episodes"] >= 1  # what was in flight, played again
    assert len(summary["ray"]["workers_lost"]) >= 1  # a replacement may land on a dying node
    assert summary["ray"]["duplicates_dropped"] == 0
    assert sum(n["episodes"] for n in summary["ray"]["nodes"].values()) == 30
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")
    assert summary["metrics"] == local.summary["metrics"]


@pytest.mark.slow
def test_a_killed_worker_loses_no_episode(cluster: Any, tmp_path: Path) -> None:
    config = RunConfig(scenario=SCENARIO, episodes=30, seed=3, concurrency=2, progress=False)
    local = run(config.replace(out=str(tmp_path / "local")))
    runner = RayRunner(
        config.replace(out=str(tmp_path / "ray"), ray="auto", ray_workers=2),
        agents=_slow_agents(),
    )
    result = asyncio.run(
        _run_and_break(runner, lambda r: ray.kill(r.slots[0].actor, no_restart=True))
    )
    _check_recovered(result, local, tmp_path)
    assert "worker-0" in result.summary["ray"]["workers_lost"][0]


def test_config_errors_before_any_ray_work(tmp_path: Path, monkeypatch: Any) -> None:
    remote = RunConfig(scenario=SCENARIO, agents=["remote", "scripted"], listen="tcp://127.0.0.1:0",
                       ray="local", progress=False)  # fmt: skip
    with pytest.raises(ConfigError, match="in-process agents only"):
        RayRunner(remote)
    with pytest.raises(ConfigError, match="ray_workers"):
        RunConfig(scenario=SCENARIO, ray_workers=-1)
    (tmp_path / "run.yaml").write_text(f"scenario: {SCENARIO}\nray: auto\nray_workers: 3\n")
    loaded = load_run_config(tmp_path / "run.yaml", {"ray_workers": 2})
    assert (loaded.ray, loaded.ray_workers) == ("auto", 2)
    with pytest.raises(ConfigError, match="ray"):
        load_run_config(None, {"scenario": SCENARIO, "ray": 5})
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    with pytest.raises(MissingDependency, match=r"pip install 'parley\[ray\]'"):
        run_on_ray(RunConfig(scenario=SCENARIO, ray="local", progress=False))


@pytest.mark.slow
def test_cli_run_ray_json(cluster: Any, capsys: Any) -> None:
    from parley.arena.cli import main

    argv = ["run", SCENARIO, "--episodes", "6", "--ray", "auto", "--ray-workers", "1"]
    assert main([*argv, "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"]["ok"] == 6
    assert summary["ray"]["workers"] == 1
    assert summary["config"]["ray"] == "auto"
    assert main([*argv, "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "Ray: 1 workers" in table
    assert "retried" in table


@pytest.mark.slow
def test_bench_ray_json(cluster: Any, capsys: Any) -> None:
    from parley.arena.cli import main

    argv = ["bench", "ray", "--json", "--episodes", "60", "--scaling-episodes", "12"]
    assert main([*argv, "--concurrent", "32", "--repeats", "1", "--work-ms", "1"]) == 0
    results = json.loads(capsys.readouterr().out)
    for key in ("ray_ratio_vs_local", "scaling_2_workers", "cpu_ms_per_episode"):
        assert results[key] > 0
    assert results["rss_kb_per_concurrent_episode"] >= 0


@pytest.mark.slow
def test_play_one_plan_at_a_time_on_workers_as_a_sampler_does(cluster: Any) -> None:
    from parley.arena.run.episode import plan_episodes

    config = RunConfig(scenario=SCENARIO, episodes=16, seed=6, concurrency=4, progress=False)
    local = run(config, keep_records=True)
    runner = RayRunner(config.replace(ray="auto", ray_workers=2), agents=_slow_agents())
    plans = plan_episodes(config, runner.seats)

    async def sample() -> list[Any]:
        async with runner.open():
            first = await asyncio.gather(*(runner.play(plan) for plan in plans[:4]))
            ray.kill(runner.slots[0].actor, no_restart=True)
            rest = await asyncio.gather(*(runner.play(plan) for plan in plans[4:]))
        return [*first, *rest]

    records = asyncio.run(sample())
    assert [r.transcript for r in records] == [r.transcript for r in local.records]
    assert runner.workers_lost  # found dead on first use, replaced
    assert all(not r.failed for r in records)
    with pytest.raises(ConfigError, match=r"inside RayRunner\.open"):
        asyncio.run(runner.play(plans[0]))


@pytest.mark.slow
def test_an_interrupted_run_writes_whole_episodes_and_a_partial_summary(
    cluster: Any, tmp_path: Path
) -> None:
    config = RunConfig(scenario=SCENARIO, episodes=40, concurrency=2, progress=False,
                       out=str(tmp_path), ray="auto", ray_workers=1)  # fmt: skip
    runner = RayRunner(config, agents=_slow_agents())

    async def interrupt() -> None:
        task = asyncio.create_task(runner.run())
        while not (tmp_path / "transcripts.jsonl").exists() or not (
            (tmp_path / "transcripts.jsonl").stat().st_size
        ):
            assert not task.done(), "the run ended before it could be interrupted"
            await asyncio.sleep(0.02)
        task.cancel()  # what SIGINT does in parley run
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(interrupt())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["partial"] is True
    assert summary["episodes_planned"] == 40
    lines = (tmp_path / "transcripts.jsonl").read_text().splitlines()
    assert 0 < len(lines) == summary["episodes"]["total"] < 40
    assert all(json.loads(line)["status"] == "ok" for line in lines)


@pytest.mark.slow
def test_seat_replicas_spread_and_survive_a_killed_replica(cluster: Any, tmp_path: Path) -> None:
    from parley.arena.run.ray_agents import SeatReplicas

    config = RunConfig(scenario=SCENARIO, episodes=24, seed=8, concurrency=6, progress=False)
    run(config.replace(out=str(tmp_path / "local")))
    replicas = SeatReplicas(_slow_agents()["player_0"], 3)
    runner = Runner(config.replace(out=str(tmp_path / "ray")), agents={"player_0": replicas})

    async def play() -> Any:
        task = asyncio.create_task(runner.run())
        deadline = time.monotonic() + 60
        while not (replicas.actors and all(replicas.busy.values())):
            assert time.monotonic() < deadline, "the replicas never all got work"
            assert not task.done(), "the run ended before a replica could be killed"
            await asyncio.sleep(0.01)
        ray.kill(replicas.actors[0], no_restart=True)
        return await asyncio.wait_for(task, timeout=120)

    result = asyncio.run(play())
    assert result.summary["episodes"] == {"total": 24, "ok": 24, "failed": 0}
    assert replicas.dead == {0}
    assert replicas.failovers >= 1  # its sessions moved and replayed elsewhere
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")
    served = ray.get([replicas.actors[i].stats.remote() for i in (1, 2)])
    assert all(stat["served"] > 0 for stat in served)


@pytest.mark.slow
def test_replicas_agent_spec(cluster: Any) -> None:
    config = RunConfig(scenario=SCENARIO, episodes=6, seed=2, progress=False)
    plain = run(config, keep_records=True)
    replicated = run(config.replace(agents={"player_1": "replicas:2:scripted"}), keep_records=True)
    assert [r.transcript["steps"] for r in replicated.records] == [
        r.transcript["steps"] for r in plain.records
    ]
    for bad in ("replicas:0:scripted", "replicas:two:scripted", "replicas:2:"):
        with pytest.raises(ConfigError, match="replicas"):
            Runner(config.replace(agents={"player_1": bad}))


@pytest.mark.slow
@pytest.mark.timeout(300)  # replicas load the model: 40 s idle, 100+ s at load 10
def test_pool_replicas_balance_update_together_and_survive_a_death(
    cluster: Any, tiny_model_dir: Path
) -> None:
    from parley.arena.cli.serve import ServeOptions, serving
    from parley.arena.inference.pool import PoolError
    from parley.arena.inference.ray_pool import RayPool
    from parley.protocols.bus import Endpoint
    from parley.protocols.messages import (
        GenerateRequest,
        GenerateResult,
        Ok,
        SamplingParams,
        WeightUpdate,
    )

    c, _ = cluster
    options = ServeOptions(model=str(tiny_model_dir), listen="tcp://127.0.0.1:0", policy="p",
                           max_batch_size=8, ray=c.address, replicas=2)  # fmt: skip
    request = GenerateRequest(policy="p", prompt="hi", params=SamplingParams(max_tokens=3))
    first = WeightUpdate(policy="p", version=1, path=str(tiny_model_dir))

    async def scenario() -> None:
        async with serving(options) as (address, _, pool):
            assert isinstance(pool, RayPool)
            client = Endpoint("trainer")
            try:
                await client.connect(address, timeout=30)
                reply = await client.request("pool", request, timeout=60)
                assert isinstance(reply, GenerateResult)
                assert reply.policy_version == 0
                assert isinstance(await client.request("pool", first, timeout=60), Ok)
            finally:
                await client.close()
            assert pool.policies == {"p": 1}
            update = WeightUpdate(policy="p", version=2, path=str(tiny_model_dir))
            before = await asyncio.gather(*(pool.generate(request) for _ in range(8)))
            assert {r.policy_version for r in before} == {1}
            assert all(count > 0 for count in await pool.requests_per_replica())
            racing = [asyncio.create_task(pool.generate(request)) for _ in range(6)]
            assert await pool.update_weights(update) == 2
            after = await asyncio.gather(*(pool.generate(request) for _ in range(6)))
            assert {r.policy_version for r in after} == {2}
            assert {r.policy_version for r in await asyncio.gather(*racing)} <= {1, 2}
            versions = await asyncio.gather(*(a.policies.remote() for a in pool.actors))
            assert versions == [{"p": 2}, {"p": 2}]  # bumped everywhere together
            with pytest.raises(PoolError, match="version"):
                await pool.update_weights(update)  # stale: not newer than what is served
            with pytest.raises(PoolError) as unknown:
                await pool.generate(GenerateRequest(policy="nobody", prompt="hi"))
            assert unknown.value.code == "unknown_policy"
            ray.kill(pool.actors[0], no_restart=True)
            survivors = await asyncio.gather(*(pool.generate(request) for _ in range(4)))
            assert {r.policy_version for r in survivors} == {2}
            assert pool.dead == {0}
            # A new actor takes the dead one's place, with the latest weights, then serves.
            await pool.settled()
            assert pool.dead == set()
            assert pool.replaced == 1
            assert pool.names[0] == f"{pool.name}-0.1"
            versions = await asyncio.gather(*(a.policies.remote() for a in pool.actors))
            assert versions == [{"p": 2}, {"p": 2}]
            answers = await asyncio.gather(*(pool.generate(request) for _ in range(8)))
            assert {r.policy_version for r in answers} == {2}
            assert all(count > 0 for count in await pool.requests_per_replica())
            third = WeightUpdate(policy="p", version=3, path=str(tiny_model_dir))
            assert await pool.update_weights(third) == 3  # the newcomer is updated too
            versions = await asyncio.gather(*(a.policies.remote() for a in pool.actors))
            assert versions == [{"p": 3}, {"p": 3}]
            # The budget (max_replacements = replicas = 2): a second death is replaced, a
            # third is not, and the pool goes on with one replica.
            for index, replaced in ((1, 2), (0, 2)):
                ray.kill(pool.actors[index], no_restart=True)
                answers = await asyncio.gather(*(pool.generate(request) for _ in range(4)))
                assert {r.policy_version for r in answers} == {3}
                await pool.settled()
                assert pool.replaced == replaced
            assert pool.dead == {0}
            assert pool.figures()["replaced"] == 2

    asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.timeout(300)  # replicas load the model: 40 s idle, 100+ s at load 10
def test_a_lone_pool_replica_that_dies_is_replaced_and_serve_keeps_serving(
    cluster: Any, tiny_model_dir: Path
) -> None:
    from parley.arena.cli.serve import ServeOptions, serving
    from parley.arena.inference.pool import PoolError
    from parley.protocols.messages import GenerateRequest, SamplingParams

    c, _ = cluster
    options = ServeOptions(model=str(tiny_model_dir), listen="tcp://127.0.0.1:0", policy="p",
                           ray=c.address, replicas=1)  # fmt: skip
    request = GenerateRequest(policy="p", prompt="hi", params=SamplingParams(max_tokens=3))

    async def scenario() -> None:
        async with serving(options) as (_, _, pool):
            ray.kill(pool.actors[0], no_restart=True)
            # The request that finds it dead waits for its replacement and is answered;
            # meanwhile serve's watch sees no failure (it would stop serving).
            answering = asyncio.create_task(pool.generate(request))
            for _ in range(600):  # (a poll: the pool has no event for a death)
                if pool.dead or answering.done():
                    break
                await asyncio.sleep(0.05)
            assert pool.backends == []
            assert (await answering).policy_version == 0
            assert pool.replaced == 1
            assert pool.dead == set()
            ray.kill(pool.actors[0], no_restart=True)  # beyond the budget (1 per replica)
            for _ in range(200):  # asking a dead replica drops it, raises no RayActorError
                if await pool.requests_per_replica() == [-1]:
                    break
                await asyncio.sleep(0.05)
            assert pool.dead == {0}
            assert await pool.fingerprints("p", ["x"]) == [None]
            with pytest.raises(PoolError) as closed:
                await pool.generate(request)
            assert closed.value.code == "closed"
            assert "died" in pool.backends[0].failure  # now serve's watch stops serving

    asyncio.run(scenario())


class _Stranded(RayRunner):
    """Its replacement workers ask for a resource no node has: they can never start."""

    replacement_wait_s = 1.0

    def _create(self, ray: Any) -> Any:
        if self.slots:
            self._actor_options = {**self._actor_options, "resources": {"nowhere": 1}}
        return super()._create(ray)


@pytest.mark.slow
def test_a_run_whose_lost_workers_cannot_be_replaced_stops_with_a_partial_summary(
    cluster: Any, tmp_path: Path
) -> None:
    from parley.arena.run.ray_runner import RayWorkersLost

    config = RunConfig(scenario=SCENARIO, episodes=30, seed=4, concurrency=2, progress=False,
                       out=str(tmp_path), ray="auto", ray_workers=1)  # fmt: skip
    runner = _Stranded(config, agents=_slow_agents())
    with pytest.raises(RayWorkersLost, match=r"no replacement started within 1 s") as lost:
        asyncio.run(_run_and_break(runner, lambda r: ray.kill(r.slots[0].actor, no_restart=True)))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["partial"] is True
    assert summary == json.loads(json.dumps(lost.value.summary))
    assert summary["episodes"]["total"] < 30
    assert summary["ray"]["workers_lost"]


def _sigterm_when_ready(
    args: list[str], ready: Any, *, launcher: tuple[str, ...] = ("-m", "parley.arena.cli")
) -> tuple[int, str, str]:
    """Start ``parley ARGS`` (``python LAUNCHER ARGS``); when ``ready(proc)`` returns,
    SIGTERM it (if still running); its (rc, stdout, stderr). Ray's C++ signal dump must not
    be in stderr."""
    import os
    import signal
    import subprocess

    argv = [sys.executable, *launcher, *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "RAY_ADDRESS": ""})  # fmt: skip
    try:
        head = ready(proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    stderr = err.decode()
    assert "SIGTERM received" not in stderr
    assert "Stack trace" not in stderr
    return proc.returncode, head + out.decode(), stderr


@pytest.mark.slow
def test_sigterm_ends_parley_run_ray_as_a_local_run_ends(cluster: Any, tmp_path: Path) -> None:
    """SIGTERM: rc 143 and a partial summary (ray.init's own handler, sys.exit, aborted
    with Ray's C++ stack dump, rc 134)."""
    c, _ = cluster
    transcripts = tmp_path / "transcripts.jsonl"

    def an_episode_written(proc: Any) -> str:
        deadline = time.monotonic() + 90
        while not (transcripts.exists() and transcripts.stat().st_size):
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "no episode was written in 90 s"
            time.sleep(0.1)
        return ""

    args = ["run", SCENARIO, "--episodes", "1000000", "--concurrency", "2", "--ray", c.address,
            "--ray-workers", "1", "--no-progress", "--out", str(tmp_path)]  # fmt: skip
    rc, _, stderr = _sigterm_when_ready(args, an_episode_written)
    assert rc == 143, stderr[-2000:]
    assert "stopped by SIGTERM" in stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["partial"] is True
    assert summary["episodes_planned"] == 1_000_000


@pytest.mark.slow
def test_sigterm_ends_parley_serve_ray_as_a_local_serve_ends(
    cluster: Any, tiny_model_dir: Path
) -> None:
    c, _ = cluster

    def serving(proc: Any) -> str:
        lines = [proc.stdout.readline().decode() for _ in range(2)]  # listening, policy
        assert "replicas on Ray (least_busy routing)" in lines[1], lines  # --routing reached it
        return "".join(lines)

    args = ["serve", "--model", str(tiny_model_dir), "--ray", c.address, "--replicas", "1",
            "--routing", "least_busy", "--listen", "tcp://127.0.0.1:0"]  # fmt: skip
    rc, out, stderr = _sigterm_when_ready(args, serving)
    assert rc == 0, stderr[-2000:]
    assert "pool closed" in out


@pytest.mark.slow
def test_a_removed_node_loses_no_episode(cluster: Any, tmp_path: Path) -> None:
    """Runs last in the module: it takes a node away from the shared cluster."""
    c, nodes = cluster
    config = RunConfig(scenario=SCENARIO, episodes=30, seed=4, concurrency=2, progress=False)
    local = run(config.replace(out=str(tmp_path / "local")))
    runner = RayRunner(
        config.replace(out=str(tmp_path / "ray"), ray="auto", ray_workers=2),
        agents=_slow_agents(),
    )
    removed: list[str] = []

    def remove_a_node(r: RayRunner) -> None:
        used = {slot.where["node"] for slot in r.slots}
        victim = next(node for node in nodes if node.node_id in used)
        removed.append(victim.node_id)
        c.remove_node(victim)

    result = asyncio.run(_run_and_break(runner, remove_a_node))
    _check_recovered(result, local, tmp_path)
    lost_on = result.summary["ray"]["nodes"].get(removed[0], {"episodes": 0})
    assert lost_on["episodes"] < 30  # the rest were played on the nodes that stayed


@pytest.mark.slow
def test_a_removed_node_with_one_worker_per_cpu_ends_the_run(cluster: Any, tmp_path: Path) -> None:
    """Runs last (after the other removal): one worker per CPU (the default) leaves the
    dead workers' replacements no CPU to start on; the run ends when its episodes are
    played instead of waiting for them for ever."""
    c, nodes = cluster
    config = RunConfig(scenario=SCENARIO, episodes=30, seed=4, concurrency=2, progress=False)
    local = run(config.replace(out=str(tmp_path / "local")))
    runner = RayRunner(config.replace(out=str(tmp_path / "ray"), ray="auto"),
                       agents=_slow_agents())  # fmt: skip

    def remove_a_node(r: RayRunner) -> None:
        used = {slot.where["node"] for slot in r.slots}
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        c.remove_node(next(n for n in nodes if n.node_id in used & alive))

    result = asyncio.run(_run_and_break(runner, remove_a_node))
    _check_recovered(result, local, tmp_path)


# The head's processes die one by one: its GCS port can still accept the probe of a lost
# worker's replacement while the head is already gone. This launcher makes the probe always
# miss, so the kill and the new actor block on the head: the run must still end at 15 s.
# (ray_slots' name: the probe's caller since 7a860f1; patching ray_runner's did nothing.)
_PROBE_MISSES = (
    "-c",
    "import parley.arena.run.ray_slots as s; s.head_refuses = lambda ray: False; "
    "from parley.arena.cli import main; raise SystemExit(main())",
)
# The driver's event loop blocked in a call once the head is gone, as a submission waiting
# on the dead head would block it (time.sleep lets other threads run, as Ray's C++ does):
# nothing on the loop can end the run; Ray's client ended it 60 s later, rc 1.
_LOOP_BLOCKED = (
    "-c",
    """
import asyncio, time
import parley.arena.run.ray_runner as r
from parley.arena.run.ray_cluster import head_refuses
played = r.RayRunner._run
async def block_when_gone(ray):
    while not head_refuses(ray):
        await asyncio.sleep(0.5)
    time.sleep(600)
async def _run(self, ray):
    blocker = asyncio.ensure_future(block_when_gone(ray))
    try:
        return await played(self, ray)
    finally:
        blocker.cancel()
r.RayRunner._run = _run
from parley.arena.cli import main
raise SystemExit(main())
""",
)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher", [("-m", "parley.arena.cli"), _PROBE_MISSES, _LOOP_BLOCKED],
                         ids=["parley", "probe-misses", "loop-blocked"])  # fmt: skip
def test_a_dead_head_ends_parley_run_with_one_line_a_partial_summary_and_status_4(
    tmp_path: Path, launcher: tuple[str, ...]
) -> None:
    """A cluster of its own (the module's stays up): its head killed mid-run. Ray's client
    used to end the process 60 s later, rc 1, its own error lines, no summary; so did a
    replacement's kill and start on the event loop when the probe missed (a flaky rc 1)."""
    other = Cluster(initialize_head=True,
                    head_node_args={"num_cpus": 1, "include_dashboard": False})  # fmt: skip
    try:
        other.add_node(num_cpus=1)
        other.wait_for_nodes()
        transcripts = tmp_path / "transcripts.jsonl"

        def kill_the_head(proc: Any) -> str:
            deadline = time.monotonic() + 90
            while not (transcripts.exists() and transcripts.stat().st_size):
                assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
                assert time.monotonic() < deadline, "no episode was written in 90 s"
                time.sleep(0.1)
            other.head_node.kill_all_processes(check_alive=False, allow_graceful=False)
            proc.wait(timeout=120)  # it ends on its own
            return ""

        args = ["run", SCENARIO, "--episodes", "1000000", "--concurrency", "2", "--ray",
                other.address, "--ray-workers", "2", "--no-progress",
                "--out", str(tmp_path)]  # fmt: skip
        rc, _, stderr = _sigterm_when_ready(args, kill_the_head, launcher=launcher)
    finally:
        other.shutdown()
    assert rc == 4, stderr[-2000:]
    ours = [line for line in stderr.splitlines() if line.startswith("parley run:")]
    assert len(ours) == 1
    assert "refused connections" in ours[0]
    assert "Failed to connect to GCS" not in stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["partial"] is True
    assert summary["episodes"]["total"] == len(transcripts.read_text().splitlines()) > 0
