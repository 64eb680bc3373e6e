"""Constraint masks under load (issue 28 §1): a verdict depends on the constraint alone.

The old matcher gave each token mask a wall-clock budget and cached a mask that ran out
of it as "no token allowed": one stall while a sane pattern's first mask was computed made
every later request with it fail as "cannot be satisfied". The matching engine now counts
work, never time. These tests stall the serving process itself (SIGSTOP/SIGCONT from a
helper process), load every core with busy loops, and check refusals over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest

from parley.arena.inference.backends.constraints import ConstraintError, check_constraint
from parley.protocols.messages import Constraint, GenerateRequest, GenerateResult, SamplingParams
from tests.busy import busy_cores

pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend
from parley.arena.inference.http import serve_http
from parley.arena.inference.pool import InferencePool, PoolConfig, PoolError

pytestmark = pytest.mark.timeout(120)

# The choose phase of deal-or-no-deal-v3: the constraint of the failed episodes.
CLAIM = r"(book=[0-2] hat=[0-2] ball=[0-2] / book=[0-2] hat=[0-2] ball=[0-2])|no agreement"


@pytest.fixture
async def backend(tiny_model_dir: Path) -> AsyncIterator[TransformersBackend]:
    b = await TransformersBackend.create(str(tiny_model_dir))
    try:
        yield b
    finally:
        await b.close()


@contextmanager
def stutter(pid: int, stopped_s: float = 0.2, running_s: float = 0.002) -> Iterator[None]:
    """Stop process ``pid`` for ``stopped_s`` at a time, letting it run ``running_s`` in
    between (a machine so loaded that the process barely gets the CPU), until the block
    ends; the process is left running."""
    code = (
        "import os, signal, sys, time\n"
        f"pid, stop, run = {pid}, {stopped_s}, {running_s}\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    os.kill(pid, signal.SIGSTOP); time.sleep(stop)\n"
        "    os.kill(pid, signal.SIGCONT); time.sleep(run)\n"
    )
    helper = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert helper.stdout is not None
    assert helper.stdout.readline() == "ready\n"
    time.sleep(0.05)  # stopped during it: the block starts inside the stutter
    try:
        yield
    finally:
        helper.kill()
        helper.wait(timeout=10)
        os.kill(pid, signal.SIGCONT)  # in case it was killed between the two signals


def claim_request(seed: int) -> GenerateRequest:
    return GenerateRequest(
        prompt="Claim:",
        params=SamplingParams(max_tokens=40, temperature=1.0, seed=seed),
        constraint=Constraint(type="regex", pattern=CLAIM),
    )


def test_unsatisfiable_and_unsupported_regexes_are_refused_up_front() -> None:
    """``[^\\s\\S]`` (no character) had let any character through (the ``regex`` module
    reads it so); look-around and backreferences are not in the dialect (vLLM refuses
    them too); a pattern that works is accepted."""
    verdicts = {}
    for pattern in (r"[^\s\S]", r"a[^\s\S]", r"(?=a)a", r"(a)\1", "null", CLAIM):
        try:
            check_constraint(Constraint(type="regex", pattern=pattern))
            verdicts[pattern] = "ok"
        except ConstraintError as exc:
            verdicts[pattern] = f"{exc.field}: {exc.reason}"
    assert verdicts == {
        r"[^\s\S]": "constraint: unsatisfiable",
        r"a[^\s\S]": "constraint: unsatisfiable",
        r"(?=a)a": "constraint: invalid",
        r"(a)\1": "constraint: invalid",
        "null": "ok",
        CLAIM: "ok",
    }


async def test_a_stall_during_the_first_mask_does_not_change_the_verdict(
    backend: TransformersBackend,
) -> None:
    """The serving process is stopped 99% of the time while a constraint's first mask is
    computed (``validate``), then runs freely: the request is accepted and decodes exactly
    as the same request does without the stall, and so do later ones (the old matcher
    refused it as unsatisfiable, and kept refusing it)."""
    # Warm-up with another constraint: the engine's view of the vocabulary is built once.
    backend.validate(GenerateRequest(prompt="x", constraint=Constraint(type="regex", pattern="ok")))
    with stutter(os.getpid()):
        backend.validate(claim_request(1))
    (stalled,) = await asyncio.wait_for(backend.generate([claim_request(1)]), 60)
    (again,) = await asyncio.wait_for(backend.generate([claim_request(1)]), 60)
    other = TransformersBackend(backend.model, backend.tokenizer)  # fresh: never stalled
    (calm,) = await asyncio.wait_for(other.generate([claim_request(1)]), 60)
    await other.close()
    texts = [r.completions[0].text for r in (stalled, again, calm)]
    assert texts[0] == texts[1] == texts[2], texts
    assert stalled.completions[0].finish_reason in ("stop", "length")


async def test_constraints_clients_cannot_use_are_a_400_naming_the_constraint(
    backend: TransformersBackend, tmp_path: Path
) -> None:
    """Invalid, unsatisfiable and too costly constraints are 400 with ``param`` (OpenAI
    clients retry a 5xx twice, tripling an attacker's cost), and so is a hot swap with a
    bad path (it was a 500)."""
    deep: dict[str, object] = {"type": "string"}
    for _ in range(20):  # a pattern that grows 4x per level: over the schema cap
        deep = {"type": "array", "items": deep}
    bodies = {
        "empty class": {"guided_regex": r"[^\s\S]"},
        "look-around": {"guided_regex": r"(?=a)a"},
        "bad syntax": {"guided_regex": "(a"},
        "too costly": {"guided_regex": "(a{1000}){1000}"},  # over the limits at token 2
        "huge schema": {"guided_json": deep},
    }
    answers = {}
    async with InferencePool({"tiny": backend}, PoolConfig(), owns_backends=False) as pool:
        runner, url = await serve_http(pool)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
                for name, extra in bodies.items():
                    body = {"model": "tiny", "prompt": "x", "max_tokens": 4, **extra}
                    async with http.post(f"{url}/completions", json=body) as r:
                        answers[name] = (r.status, (await r.json())["error"])
                swap = {"policy": "tiny", "version": 1, "path": str(tmp_path / "nothing")}
                async with http.post(f"{url}/weights", json=swap) as r:
                    answers["hot swap"] = (r.status, (await r.json())["error"])
        finally:
            await runner.cleanup()
    for name, (status, error) in answers.items():
        assert status == 400, (name, error)
        assert error["param"] == ("path" if name == "hot swap" else "constraint"), (name, error)
    assert "cannot be satisfied" in answers["empty class"][1]["message"]
    assert "look-around" in answers["look-around"][1]["message"]
    assert "too costly" in answers["too costly"][1]["message"]
    assert pool.policies == {"tiny": 0}  # the refused swap changed nothing


@pytest.mark.slow
def test_the_same_seeded_run_gives_the_same_transcripts_on_busy_cores(tmp_path: Path) -> None:
    """The README's first ``llm:`` command, twice with the same seed, with busy loops on
    every core: byte-identical transcripts (on a loaded machine the old matcher's budgets
    failed 3 of 4 episodes once and none the next time)."""
    pytest.importorskip("transformers")
    from parley.arena.cli import main
    from parley.arena.inference.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    with busy_cores(per_core=max(1, 4 // (os.cpu_count() or 1))):
        outs = []
        for k in range(2):
            out = tmp_path / f"run{k}"
            args = ["run", "negotiation/deal-or-no-deal-v3", "--agents", f"llm:{model},scripted"]
            args += ["-s", "max_turns=4", "--episodes", "2", "--seed", "3"]  # 4 talk turns
            assert main([*args, "--out", str(out)]) == 0
            outs.append((out / "transcripts.jsonl").read_bytes())
    assert outs[0] == outs[1]
    episodes = [json.loads(line) for line in outs[0].splitlines()]
    assert [e["status"] for e in episodes] == ["ok", "ok"]
    assert any(  # the choose phase ran under its regex constraint
        "constraint" in json.dumps(e["steps"]) for e in episodes
    )


async def test_a_constraint_stopped_by_the_limits_fails_alone_as_the_clients_fault(
    backend: TransformersBackend,
) -> None:
    """``(a{1000}){1000}`` passes its first mask and stops the engine at its second token
    (work limits): batched with another request, it is refused ``bad_request`` naming the
    constraint, and the other request is answered as if alone."""
    costly = GenerateRequest(
        prompt="a",
        params=SamplingParams(max_tokens=8, seed=0),
        constraint=Constraint(type="regex", pattern="(a{1000}){1000}"),
    )
    async with InferencePool(
        {"default": backend}, PoolConfig(max_wait=0.3), owns_backends=False
    ) as pool:
        alone = await pool.generate(claim_request(2))
        answers = await asyncio.gather(
            pool.generate(costly), pool.generate(claim_request(2)), return_exceptions=True
        )
    refused, answered = answers
    assert isinstance(refused, PoolError), refused
    assert (refused.code, refused.param) == ("bad_request", "constraint")
    assert "too costly" in refused.message
    assert isinstance(answered, GenerateResult), answered
    assert answered.completions[0].text == alone.completions[0].text
