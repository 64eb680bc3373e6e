"""``parley serve --adapter NAME=DIR``: LoRA adapters as models of the pool, through the real
CLI process, its HTTP front and its bus endpoint, for the transformers and vLLM backends."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parley.arena.cli import main
from tests.arena.inference.lora_util import make_adapter, reference_greedy
from tests.arena.inference.test_pool_serve import _read_line

pytest.importorskip("torch")
pytest.importorskip("peft")

PROMPT = [1, 4, 40, 41, 42, 43, 5, 10]  # token ids: a prompt the tiny model can take
N = 8


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve-adapters")
    return {
        "alice": make_adapter(tiny_model_dir, root / "alice", rank=4, seed=11),
        "bob": make_adapter(tiny_model_dir, root / "bob", rank=8, seed=12),
    }


@pytest.fixture(scope="module")
def bob_trained(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """New weights for bob (its rank: the transformers backend keeps an adapter's shape)."""
    root = tmp_path_factory.mktemp("serve-adapters-update")
    return make_adapter(tiny_model_dir, root / "bob2", rank=8, seed=13)


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as reply:
        out: dict[str, Any] = json.loads(reply.read())
        return out


@pytest.fixture(params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def served(
    request: pytest.FixtureRequest, tiny_model_dir: Path, adapters: dict[str, Path]
) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    backend = request.param
    if backend == "vllm":
        pytest.importorskip("vllm")
    cmd = [sys.executable, "-m", "parley.arena.cli", "serve", "--model", str(tiny_model_dir)]
    cmd += ["--backend", backend, "--listen", "tcp://127.0.0.1:0", "--http", "127.0.0.1:0"]
    cmd += ["--policy", "tiny", "--max-wait", "0.05"]
    cmd += [f"--adapter={name}={path}" for name, path in adapters.items()]
    if backend == "vllm":
        cmd += ["-b", "max_model_len=256"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Its own process group: on failure vLLM's engine processes are killed with it.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, bufsize=0, env=env, start_new_session=True)
    try:
        address = _read_line(proc, "pool listening on ", 240)
        url = _read_line(proc, "openai api on ", 10)
        assert proc.stdout is not None
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
        yield address, url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _complete(url: str, model: str) -> list[int]:
    status, body = _post(
        f"{url}/completions",
        {"model": model, "prompt": PROMPT, "max_tokens": N, "temperature": 0,
         "return_token_ids": True},
    )  # fmt: skip
    assert status == 200, body
    ids: list[int] = body["choices"][0]["token_ids"]
    return ids


async def _bus(address: str, policies: list[str]) -> list[Any]:
    from parley.agents.llm import BusPoolClient
    from parley.protocols.errors import RemoteError
    from parley.protocols.messages import GenerateRequest, SamplingParams

    client = await BusPoolClient.connect(address, timeout=120)
    params = SamplingParams(temperature=0, max_tokens=N)
    try:
        requests = [
            client.generate(GenerateRequest(policy=p, prompt_token_ids=PROMPT, params=params))
            for p in policies
        ]
        out: list[Any] = []
        for r in await asyncio.gather(*requests, return_exceptions=True):
            if isinstance(r, RemoteError):
                out.append(r.code)
            elif isinstance(r, BaseException):
                raise r
            else:
                out.append((list(r.completions[0].token_ids), r.policy_version))
        return out
    finally:
        await client.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_adapters_are_models_over_http_and_policies_on_the_bus(
    served: tuple[str, str, subprocess.Popen[bytes]],
    tiny_model_dir: Path,
    adapters: dict[str, Path],
    bob_trained: Path,
) -> None:
    address, url, proc = served
    models = {m["id"]: m for m in _get(f"{url}/models")["data"]}
    assert set(models) == {"tiny", "alice", "bob"}
    assert models["tiny"]["parent"] is None
    assert models["alice"]["parent"] == models["bob"]["parent"] == "tiny"
    assert {m["policy_version"] for m in models.values()} == {0}

    want = {
        name: reference_greedy(tiny_model_dir, adapters.get(name), PROMPT, N)[0]
        for name in ("tiny", "alice", "bob")
    }
    assert len({tuple(w) for w in want.values()}) == 3  # each adapter changes the output
    for name, tokens in want.items():
        got = _complete(url, name)
        assert got == tokens[: len(got)], name

    status, body = _post(f"{url}/completions", {"model": "carol", "prompt": "hi"})
    assert status == 404
    assert body["error"]["code"] == "model_not_found"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "alice" in body["error"]["message"]  # it names what is served

    # The bus: GenerateRequest(policy=NAME), several adapters at once.
    got = asyncio.run(_bus(address, ["bob", "tiny", "alice", "carol"]))
    assert got[0] == (want["bob"][: len(got[0][0])], 0)
    assert got[1][0] == want["tiny"][: len(got[1][0])]
    assert got[2][0] == want["alice"][: len(got[2][0])]
    assert got[3] == "unknown_policy"

    # Hot swap over HTTP: bob gets new weights (a PEFT dir); only bob's version moves.
    status, body = _post(f"{url}/weights", {"policy": "bob", "version": 3,
                                            "path": str(bob_trained)})  # fmt: skip
    assert status == 200, body
    assert body == {"policy": "bob", "policy_version": 3}
    versions = {m["id"]: m["policy_version"] for m in _get(f"{url}/models")["data"]}
    assert versions == {"tiny": 0, "alice": 0, "bob": 3}
    new_bob = reference_greedy(tiny_model_dir, bob_trained, PROMPT, N)[0]
    assert new_bob != want["bob"]
    got_bob = _complete(url, "bob")
    assert got_bob == new_bob[: len(got_bob)]
    assert _complete(url, "alice") == want["alice"][: len(got_bob)]
    assert _complete(url, "tiny") == want["tiny"][: len(got_bob)]

    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--adapter=alice", "NAME=DIR"),
        ("--adapter=alice=/no/such/dir", "no adapter directory"),
        ("--adapter=tiny=ADAPTER", "the base's --policy"),
        ("--adapter=alice=MODEL", "not a PEFT adapter"),
    ],
)
def test_bad_adapter_options_exit_2_before_loading(
    flag: str,
    message: str,
    tiny_model_dir: Path,
    adapters: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    flag = flag.replace("ADAPTER", str(adapters["alice"])).replace("MODEL", str(tiny_model_dir))
    args = ["serve", "--model", str(tiny_model_dir), "--policy", "tiny", flag]
    assert main([*args, "--listen", "tcp://127.0.0.1:0"]) == 2
    assert message in capsys.readouterr().err


def test_adapters_need_an_adapter_backend(
    tiny_model_dir: Path, adapters: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["serve", "--model", "m", "--backend", "openai", f"--adapter=a={adapters['alice']}"]
    assert main(args) == 2
    assert "--backend transformers or vllm" in capsys.readouterr().err
