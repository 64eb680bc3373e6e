"""The HTTP front against a browser used as a weapon, and ``parley serve --http`` off
loopback: a cross-site ``text/plain`` POST (no CORS preflight) is refused, a rebound DNS
name (wrong ``Host``) is refused, and a public bind needs ``--insecure``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from parley.arena.inference.http import serve_http
from parley.arena.inference.pool import InferencePool

pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def served(tiny_model_dir: Path) -> AsyncIterator[tuple[InferencePool, str]]:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    async with InferencePool({"tiny": backend}) as pool:
        runner, url = await serve_http(pool, "127.0.0.1", 0)
        try:
            yield pool, url
        finally:
            await runner.cleanup()


async def test_a_cross_site_text_plain_post_cannot_load_weights(
    served: tuple[InferencePool, str], tiny_model_dir: Path
) -> None:
    """What a hostile web page can send to 127.0.0.1 without a preflight: refused (415),
    the weights untouched; the same body as JSON works."""
    pool, url = served
    body = f'{{"policy": "tiny", "version": 7, "path": "{tiny_model_dir}"}}'
    async with aiohttp.ClientSession() as http:
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
            async with http.post(f"{url}/weights", data=body, headers={"Content-Type": kind}) as r:
                assert r.status == 415, kind
                error = (await r.json())["error"]
                assert "Content-Type: application/json" in error["message"]
            assert pool.policies["tiny"] == 0
        async with http.post(
            f"{url}/completions", data='{"model": "tiny", "prompt": "a"}'
        ) as r:  # a str body: aiohttp says text/plain
            assert r.status == 415
        async with http.post(
            f"{url}/weights", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 200, await r.text()
    assert pool.policies["tiny"] == 7


async def test_a_rebound_host_name_is_refused(served: tuple[InferencePool, str]) -> None:
    """DNS rebinding: a page at evil.example re-pointed at 127.0.0.1 sends its own Host."""
    _, url = served
    port = url.split(":")[2].split("/")[0]
    async with aiohttp.ClientSession() as http:
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
            async with http.get(f"{url}/models", headers={"Host": host}) as r:
                assert r.status == 421, host
                assert "unexpected Host header" in (await r.json())["error"]["message"]
            async with http.post(
                f"{url}/completions", json={"model": "tiny", "prompt": "a"}, headers={"Host": host}
            ) as r:
                assert r.status == 421, host
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST"):
            async with http.get(f"{url}/models", headers={"Host": host}) as r:
                assert r.status == 200, host


@pytest.mark.parametrize("http", ["0.0.0.0:0", ":0", "10.1.2.3:8000"])
def test_serve_refuses_a_public_http_bind_before_loading(http: str, tmp_path: Path) -> None:
    """Exit 2 with the reason, before any model loads (the model path does not exist: a
    load would fail with exit 1 instead)."""
    cmd = [sys.executable, "-m", "parley.arena.cli", "serve", "--model", str(tmp_path / "no")]
    cmd += ["--http", http]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"}
    )
    assert proc.returncode == 2, proc.stderr
    assert f"refusing to serve HTTP on {http}" in proc.stderr
    assert "--insecure" in proc.stderr


def test_insecure_allows_a_public_http_bind_and_loopback_needs_nothing() -> None:
    from parley.arena.inference.http_guard import check_http_bind
    from parley.protocols.errors import ConfigError

    check_http_bind("0.0.0.0:8000", insecure=True)
    for loopback in ("127.0.0.1:0", "localhost:8000", "[::1]:8000"):
        check_http_bind(loopback, insecure=False)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        check_http_bind("127.0.0.1", insecure=False)
