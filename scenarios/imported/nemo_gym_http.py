"""NeMo Gym's resources-server protocol, parley's side: bounded HTTP requests with the
session's cookies, dataset rows, and the Responses-API object ``/verify`` reads.

Only the standard library: a scenario stays light (no aiohttp), and every request is bounded
in time and size (:func:`request`), so a server that stalls, floods or dies fails the episode
with :class:`NemoGymServerError` instead of hanging it.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Mapping
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

from parley.protocols.errors import ConfigError, ParleyError

__all__ = [
    "MAX_ROWS_BYTES",
    "ROWS_PATH",
    "NemoGymServerError",
    "load_rows",
    "parse_rows",
    "request",
    "response_object",
]

MAX_ROWS_BYTES = 50_000_000
ROWS_PATH = "/parley/rows"
"""Where parley's launcher serves the server's example rows (JSONL)."""


class NemoGymServerError(ParleyError):
    """The NeMo Gym server failed (unreachable, stalled, oversized or malformed answer): the
    episode cannot be scored. Check the server (its log, ``server_url``) and play again."""


def response_object(row: Mapping[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    """A Responses-API object (the fields NeMo Gym's ``NeMoGymResponse`` requires) holding
    ``output``, for ``/verify``."""
    params = row.get("responses_create_params") or {}
    return {
        "id": "resp_parley",
        "created_at": 0.0,
        "model": "parley",
        "object": "response",
        "output": output,
        "parallel_tool_calls": bool(params.get("parallel_tool_calls", False)),
        "tool_choice": "auto",
        "tools": list(params.get("tools") or []),
    }


def request(
    address: tuple[str, int],
    method: str,
    path: str,
    body: Any,
    cookies: dict[str, str],
    timeout: float,
    limit: int,
) -> tuple[int, str]:
    """One HTTP request to the server at ``address``: ``body`` as JSON (None: no body), the
    ``cookies`` sent and updated from the answer; (status, text). Raises
    :class:`NemoGymServerError` on a transport failure, no answer within ``timeout`` seconds
    (a server trickling bytes included) or an answer over ``limit`` bytes."""
    conn = http.client.HTTPConnection(*address, timeout=timeout)
    jar = "; ".join(f"{k}={v}" for k, v in cookies.items())
    headers = {"Content-Type": "application/json", **({"Cookie": jar} if jar else {})}
    data = None if body is None else json.dumps(body).encode()
    deadline = time.monotonic() + timeout
    try:
        conn.request(method, path, body=data, headers=headers)
        answer = conn.getresponse()
        text = b""
        while chunk := answer.read1(65536):
            text += chunk
            if len(text) > limit:
                raise NemoGymServerError(f"{path} answered over {limit} bytes")
            if time.monotonic() > deadline:
                raise TimeoutError(f"still sending after {timeout} s")
        for header in answer.headers.get_all("Set-Cookie") or []:
            cookies.update({k: m.value for k, m in SimpleCookie(header).items()})
    except (OSError, http.client.HTTPException) as exc:
        raise NemoGymServerError(
            f"the NeMo Gym server at {address[0]}:{address[1]} failed on {path} "
            f"({type(exc).__name__}: {exc}); check that it runs, then play again"
        ) from exc
    finally:
        conn.close()
    return answer.status, text.decode("utf-8", errors="replace")


def parse_rows(text: str, where: str) -> list[dict[str, Any]]:
    try:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as exc:
        raise ConfigError(f"{where} is not JSONL: {exc}") from exc
    for i, row in enumerate(rows):
        params = row.get("responses_create_params") if isinstance(row, dict) else None
        if not isinstance(params, dict) or not isinstance(params.get("input"), list | str):
            raise ConfigError(f"{where} row {i} has no responses_create_params.input")
    if not rows:
        raise ConfigError(f"{where} holds no rows")
    return rows


def load_rows(path: str) -> list[dict[str, Any]]:
    file = Path(path)
    if not file.is_file() or file.stat().st_size > MAX_ROWS_BYTES:
        raise ConfigError(f"rows={path!r} must be a JSONL file of NeMo Gym rows (< 50 MB)")
    return parse_rows(file.read_text(), path)
