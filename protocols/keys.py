"""CURVE key files: make them, read them.

Key files use ZeroMQ's certificate format (``zmq.auth.create_certificates``): ``NAME.key``
holds the public key and can be shared; ``NAME.key_secret`` holds both keys and must stay
with its owner (it is written readable by the owner only). Keys are 40-character Z85 text.

``parley keys new arena agent-listener`` makes one pair each. The arena is started with its
secret file and the public file of each seat's agent; each agent with its own secret file
and the arena's public file::

    parley run SCENARIO --agents scripted,remote --listen tcp://0.0.0.0:5555 \\
        --curve-key keys/arena.key_secret --seat-key listener=keys/agent-listener.key
    parley agent --connect tcp://HOST:5555 --seat listener --agent module:Class \\
        --curve-key keys/agent-listener.key_secret --server-key keys/arena.key
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from parley.protocols.bus.config import BusConfig
from parley.protocols.errors import ConfigError

__all__ = ["make_key_pair", "load_public_key", "load_secret_key", "client_bus_config"]


def make_key_pair(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` in ``directory``; return both paths.

    Refuses to overwrite an existing pair (agents may already hold the old public key).
    """
    folder = Path(directory).expanduser()
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"key name {name!r} must be a plain file name")
    if public.exists() or secret.exists():
        raise ConfigError(f"{public} or {secret} exists already; remove it or pick another name")
    folder.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)  # the secret file is born private: no window where others read it
    try:
        zmq.auth.create_certificates(folder, name)
    finally:
        os.umask(old)
    public.chmod(0o644)
    return public, secret


def load_public_key(source: str | Path) -> bytes:
    """A public key from a key file (either kind) or given as 40 Z85 characters."""
    text = str(source)
    if len(text) == 40 and not Path(text).expanduser().exists():
        _check_z85(text.encode(), text)
        return text.encode()
    public, _ = _load(text)
    return public


def load_secret_key(path: str | Path) -> tuple[bytes, bytes]:
    """``(public, secret)`` from a ``.key_secret`` file."""
    public, secret = _load(str(path))
    if secret is None:
        raise ConfigError(f"{path} holds no secret key: pass the NAME.key_secret file")
    return public, secret


def client_bus_config(
    secret_file: str | Path | None,
    server_key: str | Path | None,
    *,
    base: BusConfig | None = None,
) -> BusConfig | None:
    """``base`` (default :class:`BusConfig`) as a CURVE client: this side's secret key file
    and the server's public key; ``None`` when neither is given."""
    if not secret_file and not server_key:
        return base
    if not (secret_file and server_key):
        raise ConfigError(
            "CURVE needs both this side's secret key file and the server's public key"
        )
    public, secret = load_secret_key(secret_file)
    return dataclasses.replace(
        base or BusConfig(),
        curve_public_key=public,
        curve_secret_key=secret,
        curve_server_key=load_public_key(server_key),
    )


def _load(path: str) -> tuple[bytes, bytes | None]:
    file = Path(path).expanduser()
    try:
        public, secret = zmq.auth.load_certificate(file)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot read CURVE key file {file}: {exc}; make one with `parley keys new NAME`"
        ) from exc
    _check_z85(public, file)
    return public, secret


def _check_z85(key: bytes, where: object) -> None:
    try:
        raw = z85.decode(key)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"{where}: not a Z85 CURVE key ({exc})") from exc
    if len(raw) != 32:
        raise ConfigError(f"{where}: a CURVE key is 32 bytes (40 Z85 characters)")
