"""Training on Ray (issue 15): episodes on Ray worker actors, LLM seats on the trainer's pool.

One real local Ray for the module (``ray.init(num_cpus=2)``, no dashboard). The pool is the
trainer's: a transformers backend over the tiny model, served on an authenticated ``tcp://``
listener while a stage's runner is open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from parley.agents.llm import BusPoolClient, LLMAgentConfig  # noqa: E402
from parley.arena.run.config import RunConfig  # noqa: E402
from parley.arena.run.runner import Runner  # noqa: E402
from parley.arena.training.ray_train import SeatPolicy, TrainRayRunner  # noqa: E402
from parley.arena.training.sampler import (  # noqa: E402
    AsyncSampler,
    ConstraintLog,
    RecordingClient,
    SamplerConfig,
    samples_from_record,
)
from parley.protocols.bus.config import BusConfig  # noqa: E402
from parley.protocols.errors import PeerDead, RemoteError, RequestTimeout  # noqa: E402
from parley.protocols.messages import WeightUpdate  # noqa: E402
from tests.arena.training.referential import (  # noqa: E402
    REFERENTIAL_K4,
    SCENARIO,
    two_stage_recipe,
)

AGENT = LLMAgentConfig(policy="listener", temperature=1.0, max_tokens=4, request_timeout=0.0)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


async def _pool(model_dir: Path) -> Any:
    import transformers

    from parley.arena.inference.backends.tokenizer import load_tokenizer
    from parley.arena.inference.backends.transformers import TransformersBackend
    from parley.arena.inference.pool import InferencePool, PoolConfig

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32")
    backend = TransformersBackend(model.eval(), load_tokenizer(str(model_dir)), seed=0)
    return await InferencePool({"listener": backend}, PoolConfig(max_wait=0.002)).start()


def _config() -> RunConfig:
    return RunConfig(
        scenario=SCENARIO,
        scenario_kwargs=REFERENTIAL_K4,
        agents={"speaker": "scripted", "listener": "llm:listener"},
        progress=False,
        act_timeout=120.0,
    )


@pytest.mark.timeout(240)
async def test_samples_from_ray_workers_carry_tokens_and_constraints_as_local_ones(
    tiny_model_dir: Path, local_ray: None
) -> None:
    pool = await _pool(tiny_model_dir)
    tokenizer = pool.tokenizer("listener")
    ray_log, local_log = ConstraintLog(), ConstraintLog()
    runner = TrainRayRunner(
        _config(),
        {"listener": SeatPolicy(AGENT)},
        pool=pool,
        tokenizer=tokenizer,
        log=ray_log,
        workers=2,
    )
    from parley.agents.llm import LLMAgent

    local_client = RecordingClient(pool, local_log)
    local = Runner(
        _config(),
        agents={"listener": lambda: LLMAgent(local_client, tokenizer, config=AGENT)},
    )
    try:
        sampler = AsyncSampler(
            runner, SamplerConfig(batch_size=4, concurrency=4, seed=3), policies=["listener"]
        )
        batches = []
        model = pool.backend("listener").model
        same = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
        async with runner.open():
            assert runner.access is not None
            assert runner.access.address.startswith("tcp://127.")
            async for batch in sampler.batches(limit=2):
                batches.append(batch)
                # As the loop does after each update: new weights (the same values here, so
                # the local replay below matches) under a new version, then publish.
                await pool.update_weights(
                    WeightUpdate(policy="listener", version=len(batches), tensors=same)
                )
                sampler.publish(len(batches))
        assert [len(b.records) for b in batches] == [4, 4]
        assert all(max(b.staleness) == 0 for b in batches)  # S = 0 holds on Ray
        # The same plans played locally against the same pool give the same transcripts,
        # token records and constraints: nothing is lost on the way back from a worker.
        async with local.open():
            for batch in batches:
                for record in batch.records:
                    plan = sampler_plan(sampler, record.index)
                    mirror = await local.play(plan)
                    assert _generated(mirror) == _generated(record)
                    ray_samples = samples_from_record(record, log=ray_log)
                    local_samples = samples_from_record(mirror, log=local_log)
                    assert ray_samples
                    assert len(ray_samples) == len(local_samples)
                    for got, want in zip(ray_samples, local_samples, strict=True):
                        assert got.token_ids
                        assert got.logprobs
                        assert got.constraint is not None  # the listener picks a name
                        assert got.constraint == want.constraint
                        assert got.prompt_ids == want.prompt_ids
        assert {s.policy_version for b in batches for r in b.records
                for s in samples_from_record(r)} == {0, 1}  # fmt: skip
    finally:
        await pool.close()


def _generated(record: Any) -> list[tuple[str, list[int]]]:
    """Each generation of an episode: the seat and its token ids (versions aside)."""
    return [
        (trajectory.agent, list(tokens.token_ids))
        for trajectory in record.trajectories
        for turn in trajectory.turns
        for tokens in turn.tokens
    ]


def sampler_plan(sampler: AsyncSampler, index: int) -> Any:
    """The plan the sampler made for episode ``index`` (plans depend on the index only)."""
    saved = sampler._next_index
    sampler._next_index = index
    try:
        return sampler._plan()
    finally:
        sampler._next_index = saved


@pytest.mark.timeout(120)
async def test_the_pool_listener_admits_only_the_workers_key_and_only_to_generate(
    tiny_model_dir: Path, local_ray: None
) -> None:
    import zmq

    pool = await _pool(tiny_model_dir)
    runner = TrainRayRunner(
        _config(),
        {"listener": SeatPolicy(AGENT)},
        pool=pool,
        tokenizer=pool.tokenizer("listener"),
        log=ConstraintLog(),
        workers=1,
    )
    model = pool.backend("listener").model
    same = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    try:
        async with runner.open():
            access = runner.access
            assert access is not None
            public, secret = zmq.curve_keypair()  # a stranger who knows the pool's key
            strangers = [
                BusConfig(connect_timeout=2.0),
                BusConfig(curve_public_key=public, curve_secret_key=secret,
                          curve_server_key=access.server_key, connect_timeout=2.0),
            ]  # fmt: skip
            for config in strangers:
                with pytest.raises((RequestTimeout, PeerDead, TimeoutError)):
                    await BusPoolClient.connect(access.address, timeout=2.0, config=config)
            # The workers' own key gets in.
            ok = BusConfig(curve_public_key=access.client_public,
                           curve_secret_key=access.client_secret,
                           curve_server_key=access.server_key)  # fmt: skip
            client = await asyncio.wait_for(
                BusPoolClient.connect(access.address, timeout=10.0, config=ok), 15
            )
            try:
                # ... to generate, never to push weights into the trainer's pool.
                push = WeightUpdate(policy="listener", version=99, tensors=same)
                with pytest.raises(RemoteError):
                    await client.endpoint.request(client.pool, push, timeout=10.0)
                assert pool.policies["listener"] == 0
            finally:
                await client.close()
    finally:
        await pool.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_parley_train_ray_runs_the_referential_recipe_end_to_end(
    tiny_model_dir: Path, tmp_path: Path, local_ray: None, capsys: Any
) -> None:
    import json

    import yaml

    from parley.arena.cli import main

    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(two_stage_recipe(tiny_model_dir, tmp_path / "run")))
    assert main(["train", "--config", str(path), "--ray", "--ray-workers", "2"]) == 0
    out = tmp_path / "run"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["stage"] for r in rows] == ["listener"] * 3 + ["joint"] * 2
    for row in rows:
        assert row["samples"] > 0  # decisions rebuilt from the token records shipped back
        assert row["stale_max"] <= 1
        assert sum(row["stale_hist"]) == 8
    # The workers asked the trainer's pool, in every stage. Per stage, not per row: a row
    # counts the requests completed since the last one, and a batch sampled ahead (staleness
    # 1) may have had all of its requests answered before the last row on a loaded machine.
    for stage in ("listener", "joint"):
        assert sum(r["pool_requests"] for r in rows if r["stage"] == stage) > 0, rows
    assert rows[-1]["version_listener"] == 5
    assert rows[-1]["version_speaker"] == 5  # one version counter: pushed at 4 and 5
    summary = json.loads((out / "summary.json").read_text())
    assert [s["updates"] for s in summary["stages"]] == [3, 2]
    assert all(s["failed_episodes"] == 0 for s in summary["stages"])
    assert "trainer" not in summary  # the default: no GPU in the cluster, trainer stays here
    assert all(s["ray"]["workers_started"] == 2 for s in summary["stages"])
    for policy in ("speaker", "listener"):
        assert (out / "checkpoints" / policy / "config.json").exists()
    assert "checkpoint listener" in capsys.readouterr().out


@pytest.mark.timeout(240)
async def test_a_worker_killed_mid_stage_costs_no_sample(
    tiny_model_dir: Path, local_ray: None
) -> None:
    pool = await _pool(tiny_model_dir)
    log = ConstraintLog()
    runner = TrainRayRunner(
        _config(),
        {"listener": SeatPolicy(AGENT)},
        pool=pool,
        tokenizer=pool.tokenizer("listener"),
        log=log,
        workers=2,
    )
    sampler = AsyncSampler(
        runner, SamplerConfig(batch_size=6, concurrency=6, staleness=2, seed=4),
        policies=["listener"],
    )  # fmt: skip
    batches = []
    try:
        async with runner.open():
            async for batch in sampler.batches(limit=3):
                batches.append(batch)
                if len(batches) == 1:  # episodes are in flight on both workers now
                    ray.kill(runner.slots[0].actor, no_restart=True)
            # The replacement joins the stage (takes episodes) once its actor has started.
            for _ in range(600):
                if all(slot.where for slot in runner.slots):
                    break
                await asyncio.sleep(0.1)
            figures = runner.figures()
    finally:
        await pool.close()
    records = [r for b in batches for r in b.records]
    assert len(records) == 18
    assert not [b.failures for b in batches if b.failures]  # a lost worker is no failure
    assert len({r.index for r in records}) == 18  # none counted twice
    assert runner.workers_lost  # the kill was seen, a replacement took over
    assert len(runner.slots) == 3
    assert all(s.constraint is not None for r in records for s in samples_from_record(r, log=log))
    # What summary.json says of the stage (its "ray" entry), as parley run --ray counts it.
    assert figures["workers_started"] == 3
    assert figures["workers_replaced"] == 1
    assert len(figures["workers_lost"]) == 1
    assert figures["workers_lost"][0].startswith("worker-0: ")
    retried = figures["retried"]
    assert retried["episodes"] >= 1  # worker-0 had episodes in flight when killed
    assert len(retried["episode_ids"]) == len(set(retried["episode_ids"]))
    played = sum(node["episodes"] for node in figures["nodes"].values())
    assert played >= 18  # every kept episode, plus any dropped as stale
    assert sum(len(node["workers"]) for node in figures["nodes"].values()) == 3


# ------------------------------------------------------------------ the trainer's own actor


def test_a_trainer_actor_without_ray_is_a_config_error(tmp_path: Path) -> None:
    from parley.arena.training.config import load_train_config
    from parley.protocols.errors import ConfigError

    data = {**two_stage_recipe(tmp_path, tmp_path / "run"), "ray_trainer_actor": True}
    with pytest.raises(ConfigError, match="ray_trainer_actor needs ray"):
        load_train_config(data=data)
    assert load_train_config(data={**data, "ray": "local"}).ray_trainer_actor is True


@pytest.mark.timeout(240)
async def test_outputs_come_back_from_the_trainer_actor_node_except_those_already_here(
    tmp_path: Path, local_ray: None
) -> None:
    from parley.arena.training import ray_train
    from parley.arena.training.ray_train import TrainerActor, fetch_outputs

    there, here = tmp_path / "there", tmp_path / "here"
    (there / "checkpoints" / "listener").mkdir(parents=True)
    weights = bytes(range(256)) * 1000  # 256 kB, shipped in chunks below
    (there / "checkpoints" / "listener" / "model.safetensors").write_bytes(weights)
    (there / "summary.json").write_text('{"stages": []}')
    (there / "empty.txt").write_text("")
    actor = ray.remote(num_cpus=0)(TrainerActor).remote()
    chunk = ray_train.SHIP_CHUNK
    ray_train.SHIP_CHUNK = 10_000  # 26 reads for the weights: the offsets must add up
    try:
        assert await fetch_outputs(actor, there, here) == 3
        assert (here / "checkpoints" / "listener" / "model.safetensors").read_bytes() == weights
        assert (here / "summary.json").read_text() == '{"stages": []}'
        assert (here / "empty.txt").read_text() == ""
        assert await fetch_outputs(actor, there, here) == 0  # shared storage: nothing moves
        (here / "summary.json").write_text("{}")  # a stale copy here is replaced
        assert await fetch_outputs(actor, there, here) == 1
        assert (here / "summary.json").read_text() == '{"stages": []}'
    finally:
        ray_train.SHIP_CHUNK = chunk
        ray.kill(actor)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_parley_train_ray_trainer_actor_runs_the_recipe_with_the_bar_and_outputs_here(
    tiny_model_dir: Path, tmp_path: Path, local_ray: None, capsys: Any
) -> None:
    import json
    import os

    import yaml

    from parley.arena.cli import main

    path = tmp_path / "train.yaml"
    recipe = {**two_stage_recipe(tiny_model_dir, tmp_path / "run"), "progress": True}
    path.write_text(yaml.safe_dump(recipe))
    args = ["train", "--config", str(path), "--ray", "--ray-workers", "2", "--trainer-actor"]
    assert main(args) == 0
    out = tmp_path / "run"
    summary = json.loads((out / "summary.json").read_text())
    trainer = summary["trainer"]
    assert trainer["actor"] is True
    assert trainer["pid"] != os.getpid()  # the trainer ran in its actor, not here
    assert trainer["options"]["num_gpus"] == 0  # no GPU in this cluster
    assert trainer["files_shipped"] == 0  # the actor's node is this one
    assert [s["updates"] for s in summary["stages"]] == [3, 2]
    for stage in summary["stages"]:
        assert stage["failed_episodes"] == 0
        assert stage["ray"]["pool"].startswith("tcp://127.0.0.1:")  # the actor's node
        assert stage["ray"]["workers_started"] == 2
        assert sum(n["episodes"] for n in stage["ray"]["nodes"].values()) >= stage["episodes"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["stage"] for r in rows] == ["listener"] * 3 + ["joint"] * 2
    assert all(r["samples"] > 0 and r["pool_requests"] > 0 for r in rows)
    for policy in ("speaker", "listener"):
        assert (out / "checkpoints" / policy / "config.json").exists()
    captured = capsys.readouterr()
    assert "5/5" in captured.err  # the driver's bar, read from the actor, reached the end
    assert "checkpoint listener" in captured.out
    assert "joint on Ray: 2 workers started, 0 lost, 0 episodes retried" in captured.out


@pytest.mark.timeout(300)
def test_an_error_in_the_trainer_actor_is_raised_in_the_driver_as_itself(
    tiny_model_dir: Path, tmp_path: Path, local_ray: None
) -> None:
    from parley.arena.training.config import load_train_config
    from parley.arena.training.loop import train
    from parley.protocols.errors import ConfigError

    data = {**two_stage_recipe(tiny_model_dir, tmp_path / "run"), "ray": "local", "ray_workers": 1}
    data["ray_trainer_actor"] = True
    data["stages"][0]["agents"] = {"speaker": "no_such_module:Bot", "listener": "policy:listener"}
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        train(load_train_config(data=data))
    assert not (tmp_path / "run" / "summary.json").exists()  # nothing claims a finished run


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_trainer_actor_killed_mid_run_ends_the_run_with_an_error_naming_it(
    tiny_model_dir: Path, tmp_path: Path, local_ray: None
) -> None:
    import time
    from concurrent.futures import ThreadPoolExecutor

    from parley.arena.training.config import load_train_config
    from parley.arena.training.loop import train

    data = {**two_stage_recipe(tiny_model_dir, tmp_path / "run"), "ray": "local", "ray_workers": 1}
    data["ray_trainer_actor"] = True
    data["stages"][0]["max_updates"] = 50  # long enough to be killed in the middle
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(train, load_train_config(data=data))
        deadline = time.monotonic() + 300
        state = None
        while time.monotonic() < deadline and not running.done():
            names = [n for n in ray.util.list_named_actors() if n.startswith("parley-trainer-")]
            if names:
                actor = ray.get_actor(names[0])
                state = ray.get(actor.state.remote())
                if state is not None and state["completed"] >= 1:  # updates under way
                    ray.kill(actor, no_restart=True)
                    break
            time.sleep(0.5)
        assert state is not None, "the trainer actor never showed a bar"
        assert state["completed"] >= 1, "the run never got going"
        # The bar's total travels too (a stage's restart grows it): every stage's updates.
        assert state["total"] == sum(stage["max_updates"] for stage in data["stages"])
        with pytest.raises(RuntimeError, match=r"trainer's Ray actor parley-trainer-\w+ died"):
            running.result(timeout=120)
    assert not [n for n in ray.util.list_named_actors() if n.startswith("parley-trainer-")]
