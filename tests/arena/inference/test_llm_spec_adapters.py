"""``llm:BASE?adapter=DIR&policy=NAME``: seats on one base share one in-process pool."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from parley.arena.inference.llm_spec import close_shared_pools, parse_llm_spec, resolve_llm
from parley.arena.run.agent_specs import SeatContext
from parley.protocols.errors import ConfigError
from parley.protocols.messages import GenerateRequest, SamplingParams

pytest.importorskip("torch")
pytest.importorskip("peft")
from parley.arena.inference.backends.lora import save_random_adapter

pytestmark = pytest.mark.timeout(240)

SCENARIO = "negotiation/deal-or-no-deal-v0"


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("seat-adapters")
    return [save_random_adapter(tiny_model_dir, root / f"seat{i}", seed=10 + i) for i in range(2)]


def test_adapter_key_and_default_policy() -> None:
    spec = parse_llm_spec("models/base?adapter=out/checkpoints/speaker/&temperature=0")
    assert (spec.model, spec.adapter) == ("models/base", "out/checkpoints/speaker/")
    assert spec.agent.policy == "speaker"  # the adapter directory's name
    assert parse_llm_spec("m?adapter=a/b&policy=mine").agent.policy == "mine"
    assert parse_llm_spec("m").adapter == ""
    with pytest.raises(ConfigError, match="needs a PEFT adapter directory"):
        parse_llm_spec("m?adapter=")
    vllm = parse_llm_spec("m?backend=vllm&adapter=a&max_loras=8&max_lora_rank=32")
    assert dict(vllm.backend_options) == {"max_loras": "8", "max_lora_rank": "32"}
    # vLLM's slot sizes mean nothing without vLLM and an adapter: refused, not ignored.
    for wrong in ("m?max_loras=8", "m?adapter=a&max_loras=8", "m?backend=vllm&max_lora_rank=8"):
        with pytest.raises(ConfigError, match="go with backend=vllm and adapter=DIR"):
            parse_llm_spec(wrong)


def test_a_missing_adapter_is_refused_when_the_seat_is_resolved(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    seat = SeatContext(scenario=SCENARIO, seat="player_0")
    with pytest.raises(ConfigError, match="no PEFT adapter there"):
        resolve_llm(f"{tiny_model_dir}?adapter={tmp_path}", seat)


async def test_two_adapter_seats_share_one_pool_and_batch_together(
    tiny_model_dir: Path, adapters: list[Path], tmp_path: Path
) -> None:
    query = "max_wait=0.5&system_prompt=none"
    specs = {
        "player_0": f"{tiny_model_dir}?adapter={adapters[0]}&{query}",
        "player_1": f"{tiny_model_dir}?adapter={adapters[1]}&policy=rival&{query}",
    }
    agents = {
        seat: resolve_llm(spec, SeatContext(scenario=SCENARIO, seat=seat))()  # type: ignore[operator]
        for seat, spec in specs.items()
    }
    clients = {seat: agent.client for seat, agent in agents.items()}
    policies = {seat: agent.config.policy for seat, agent in agents.items()}
    assert policies == {"player_0": "seat0", "player_1": "rival"}
    tokenizer = agents["player_0"].tokenizer
    prompt = tokenizer.encode_chat([{"role": "user", "content": "make me an offer"}])

    def request(seat: str) -> GenerateRequest:
        params = SamplingParams(temperature=0, max_tokens=5)
        return GenerateRequest(policy=policies[seat], prompt_token_ids=prompt, params=params)

    try:
        jobs = [(seat, clients[seat].generate(request(seat))) for seat in specs for _ in range(2)]
        results = await asyncio.gather(*(job for _, job in jobs))
        pool = await clients["player_0"].pool()  # type: ignore[attr-defined]
        assert pool is await clients["player_1"].pool()  # type: ignore[attr-defined]
        assert pool.stats.batches == 1  # both seats' requests in one batch
        assert pool.stats.batched_requests == 4
        assert pool.policies == {str(tiny_model_dir): 0, "seat0": 0, "rival": 0}
        (backend,) = pool.backends
        assert backend.adapters == {"seat0": 0, "rival": 0}  # each loaded once
        tokens = {r.policy: r.completions[0].token_ids for r in results}
        assert tokens["seat0"] != tokens["rival"]  # each seat plays its own adapter
        # Another adapter under a policy name in use is refused, naming both directories.
        other = f"{tiny_model_dir}?adapter={adapters[1]}&policy=seat0&{query}"
        client = resolve_llm(other, SeatContext(scenario=SCENARIO, seat="player_0"))().client  # type: ignore[operator]
        with pytest.raises(ConfigError, match="two adapters under the policy name 'seat0'"):
            await client.generate(request("player_0"))
    finally:
        await close_shared_pools()


def _run_two_adapter_seats(model: Path, adapters: list[Path], out: Path, query: str) -> None:
    """``parley run`` with one adapter seat per player; each seat's tokens name its adapter."""
    from parley.arena.cli import main

    seat = f"llm:{model}?{query}max_tokens=6&adapter="
    agents = f"{seat}{adapters[0]},{seat}{adapters[1]}"
    status = main(
        [
            *("run", SCENARIO, "--agents", agents, "--episodes", "2", "--concurrency", "2"),
            *("--no-progress", "--out", str(out), "--act-timeout", "240", "-s", "max_turns=2"),
        ]
    )
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == {"ok": 2, "failed": 0, "total": 2}
    used = {
        traj["agent"]: {t["policy"] for turn in traj["turns"] for t in turn["tokens"]}
        for line in (out / "trajectories.jsonl").read_text().splitlines()
        for traj in [json.loads(line)]
    }
    assert used == {"player_0": {"seat0"}, "player_1": {"seat1"}}


@pytest.mark.timeout(300)
def test_parley_run_with_two_adapter_seats(
    tiny_model_dir: Path, adapters: list[Path], tmp_path: Path
) -> None:
    _run_two_adapter_seats(tiny_model_dir, adapters, tmp_path, "")


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(400)
def test_parley_run_with_two_adapter_seats_on_vllm(
    tiny_model_dir: Path, adapters: list[Path], tmp_path: Path
) -> None:
    # The in-process vLLM engine is sized for adapters when it starts (max_loras, rank)
    # although the seats' adapters are added only afterwards.
    pytest.importorskip("vllm")
    _run_two_adapter_seats(tiny_model_dir, adapters, tmp_path, "backend=vllm&")
