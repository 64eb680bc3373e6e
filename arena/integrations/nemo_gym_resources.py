"""One of NeMo Gym's own resources servers, started for a parley scenario to play.

NeMo Gym (``nemo-gym``) ships its resources servers as the ``resources_servers`` package
(``resources_servers/NAME/app.py``, a :class:`SimpleResourcesServer` subclass, its config in
``configs/*.yaml`` and example rows in ``data/example.jsonl``). ``ng_run`` would start one in
a ``uv``-built environment and publish its address through a head server (both need the
network); this module starts the server's own class, unchanged, on a loopback port:

- **as a script**, run by the Python of an environment that has ``nemo-gym`` installed
  (``.venv/nemo-gym``, which ``make install-nemo-gym`` builds where Python 3.12 runs):
  ``PYTHON nemo_gym_resources.py NAME [--port P]`` builds ``NAME``'s server from its config
  (the server's own config class, the fields of its YAML entry), serves its FastAPI app with
  uvicorn, plus one route of parley's, ``GET /parley/rows`` (the server's example rows, the
  ``data/example.jsonl`` it ships), prints one JSON line, ``{"url", "rows", "server"}``, then
  serves until killed. The script imports only the standard library at
  module level, so that Python needs nothing of parley.
- **as a module** in parley's environment: :func:`resources_server` starts the script in a
  child process and yields the :class:`ResourcesServer`, whose ``id``
  (``nemogym:NAME@127.0.0.1:PORT``) is the scenario to ``make`` or ``parley run``;
  ``python -m parley.arena.integrations.nemo_gym_resources NAME`` does the same from the
  command line and prints the ``parley run`` command that plays it.

A server that does not start within ``start_timeout`` (its Python missing, the server's import
failing, a config field it needs and this module cannot supply, such as a judge model's
address) raises :class:`NemoGymUnavailable` with the child's last output, never hangs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

__all__ = [
    "NemoGymUnavailable",
    "ResourcesServer",
    "resources_server",
]

PYTHON_ENV = "PARLEY_NEMO_GYM_PYTHON"
"""Environment variable naming the Python of an environment with ``nemo-gym`` installed."""


class NemoGymUnavailable(RuntimeError):
    """NeMo Gym's server could not be started here (the message says why and what to do)."""


@dataclasses.dataclass(frozen=True)
class ResourcesServer:
    """A running NeMo Gym resources server."""

    url: str
    """``http://127.0.0.1:PORT``."""
    rows: str
    """The path of the server's example rows (``data/example.jsonl``)."""
    server: str
    """The server's name (its folder in ``resources_servers``)."""

    @property
    def id(self) -> str:
        """The parley scenario that plays this server: ``nemogym:NAME@HOST:PORT``."""
        return f"nemogym:{self.server}@{self.url.removeprefix('http://')}"


def nemo_gym_python() -> Path:
    """The Python that runs NeMo Gym: ``$PARLEY_NEMO_GYM_PYTHON``, else the Makefile's
    ``.venv/nemo-gym/bin/python`` beside parley's environment (it may not exist)."""
    given = os.environ.get(PYTHON_ENV)
    return Path(given) if given else Path(sys.prefix) / "nemo-gym" / "bin" / "python"


@contextlib.contextmanager
def resources_server(
    name: str,
    *,
    python: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    start_timeout: float = 120.0,
) -> Iterator[ResourcesServer]:
    """Start NeMo Gym's server ``name`` in a child process on ``host:port`` (0: a free port);
    stop it on exit.

    Raises :class:`NemoGymUnavailable` when the Python is missing or the server does not
    announce itself within ``start_timeout`` seconds (a loaded machine imports NeMo Gym, Ray
    included, in 5-20 s).
    """
    exe = Path(python) if python is not None else nemo_gym_python()
    if not exe.exists():
        raise NemoGymUnavailable(
            f"no {exe}: install nemo-gym in its own environment (Python 3.12+: "
            f"`make install-nemo-gym PYTHON312=/path/to/python3.12`) or set ${PYTHON_ENV}"
        )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        # -I: nothing of parley's environment (PYTHONPATH, this folder) leaks in.
        [str(exe), "-I", __file__, name, "--host", host, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        line = _first_json_line(proc, start_timeout)
        # The server's log is read from now on, so that a full pipe never stalls it.
        threading.Thread(target=_drain, args=(proc,), daemon=True).start()
        yield ResourcesServer(url=line["url"], rows=line["rows"], server=line["server"])
    finally:
        proc.kill()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def _drain(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None  # (Popen was given stdout=PIPE)
    with contextlib.suppress(OSError, ValueError):  # the pipe closed as the server stopped
        while proc.stdout.read(65536):
            pass


def _first_json_line(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The child's announcement; its output so far in the error when none comes in time."""
    assert proc.stdout is not None  # (Popen was given stdout=PIPE)
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while True:
        newline = seen.find(b"\n")
        while newline >= 0:
            line, seen = seen[:newline], seen[newline + 1 :]
            if line.startswith(b'{"url": '):  # (the server may log other JSON first)
                return dict(json.loads(line))
            newline = seen.find(b"\n")
        left = deadline - time.monotonic()
        if left <= 0 or (proc.poll() is not None and not select.select([fd], [], [], 0)[0]):
            break
        if select.select([fd], [], [], min(left, 1.0))[0]:
            chunk = os.read(fd, 65536)
            if not chunk and proc.poll() is not None:
                break
            seen += chunk
    tail = seen.decode(errors="replace")[-2000:]
    state = f"exited {proc.returncode}" if proc.poll() is not None else f"silent {timeout:.0f} s"
    raise NemoGymUnavailable(f"NeMo Gym's server did not start ({state}): {tail}")


# -- the script (NeMo Gym's Python) --------------------------------------------------------


def _server_class(name: str) -> tuple[Any, Path]:
    """The resources server class defined in ``resources_servers/NAME/app.py``, its folder."""
    import importlib

    from nemo_gym.base_resources_server import SimpleResourcesServer

    module = importlib.import_module(f"resources_servers.{name}.app")
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, SimpleResourcesServer)
        and value.__module__ == module.__name__
    ]
    if len(found) != 1:
        raise SystemExit(f"resources_servers.{name}.app defines {len(found)} resources servers")
    return found[0], Path(str(module.__file__)).parent


def _config_fields(folder: Path, name: str) -> dict[str, Any]:
    """The fields of ``name``'s entry under ``resources_servers`` in its YAML configs."""
    from omegaconf import OmegaConf

    for path in sorted((folder / "configs").glob("*.yaml")):
        for top in cast("dict[str, Any]", OmegaConf.to_container(OmegaConf.load(path))).values():
            entry = (top or {}).get("resources_servers", {}).get(name)
            if entry is not None:
                return dict(entry)
    return {}


def _serve(name: str, host: str, port: int) -> None:
    import uvicorn
    from fastapi.responses import PlainTextResponse
    from nemo_gym.config_types import BaseServerConfig
    from nemo_gym.server_utils import ServerClient
    from omegaconf import OmegaConf

    cls, folder = _server_class(name)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections queue from now on: the announcement below is true at once
    port = sock.getsockname()[1]
    fields = {**_config_fields(folder, name), "name": name, "host": host, "port": port}
    fields.setdefault("entrypoint", "app.py")
    config = cls.model_fields["config"].annotation.model_validate(fields)
    # No head server: this server calls no other (a judge-model server would need one).
    client = ServerClient(
        head_server_config=BaseServerConfig(host=host, port=0),
        global_config_dict=OmegaConf.create({}),
    )
    server = cls(config=config, server_client=client)
    app = server.setup_webserver()
    server.setup_liveness(app)
    rows = folder / "data" / "example.jsonl"
    # One route beside NeMo Gym's own: its example rows, for a scenario in another process.
    app.get("/parley/rows")(lambda: PlainTextResponse(rows.read_text()))
    announcement = {"url": f"http://{host}:{port}", "rows": str(rows), "server": name}
    print(json.dumps(announcement), flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def main(argv: Sequence[str] | None = None) -> int:
    """The script (under NeMo Gym's Python) or ``python -m`` (under parley's): see above."""
    parser = argparse.ArgumentParser(prog="nemo_gym_resources")
    parser.add_argument("server", help="a folder of NeMo Gym's resources_servers")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--python", default=None, help=f"NeMo Gym's Python (${PYTHON_ENV})")
    args = parser.parse_args(argv)
    if __package__:  # parley's side: start the server under NeMo Gym's Python
        # SIGTERM unwinds like Ctrl-C, so the server child is stopped with this process.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with resources_server(
            args.server, python=args.python, host=args.host, port=args.port
        ) as served:
            print(f"nemo-gym: serving {served.server} at {served.url}", flush=True)
            print(f"play it: parley run {served.id} --episodes 4", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        return 0
    # Run as a script, this file's folder leads sys.path, where parley's own nemo_gym.py
    # would shadow NeMo Gym's package.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    _serve(args.server, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
