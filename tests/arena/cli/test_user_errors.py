"""Every user error of the ``parley`` command is one line on stderr naming the command, with a
hint, and a non-zero exit status: never a traceback (issue 14, table-driven).

The cases run ``parley.arena.cli.main`` in this process (an exception escaping ``main`` is a
traceback for the user, and fails the test); :func:`test_errors_in_a_real_process` runs a
few through the installed console script, piped, to check the line is not wrapped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.arena.cli import main

RUN = ("run", "negotiation/deal-or-no-deal-v1", "--episodes", "1", "--no-progress")
TRAIN_YAML = str(Path(__file__).parents[3] / "examples" / "referential.yaml")


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that another socket holds."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _one_line_error(
    argv: list[str], capsys: pytest.CaptureFixture[str], *, status: int, command: str
) -> str:
    got = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(f"parley {command}:")]
    assert got == status, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    return lines[0]


# (argv, exit status, words the line must hold)
CASES: dict[str, tuple[list[str], int, tuple[str, ...]]] = {
    "bad scenario argument": (
        [*RUN, "-s", "max_turnz=3"],
        2,
        ("max_turnz", "its arguments:", "max_turns"),
    ),
    "bad scenario argument value": ([*RUN, "-s", "max_turns=abc"], 2, ("max_turns",)),
    "unwritable --out": ([*RUN, "--out", "/proc/parley-out"], 2, ("--out", "/proc/parley-out")),
    "--out is a file": ([*RUN, "--out", "/etc/hostname"], 2, ("--out",)),
    "missing llm: model": (
        [*RUN, "--agents", "llm:~/no-such-parley-model,scripted"],
        2,
        ("parley model tiny", str(Path.home() / "no-such-parley-model")),
    ),
    "remote without --listen": (
        ["run", "collaboration/referential-v0", "--agents", "scripted,remote"],
        2,
        ("--listen",),
    ),
    "train: no config file": (["train", "--config", "/no/such.yaml"], 2, ("/no/such.yaml",)),
    "train: unknown override key": (
        ["train", "--config", TRAIN_YAML, "pg.lrr=1e-3"],
        2,
        ("pg.lrr", "valid keys under pg", "lr"),
    ),
    "train: unknown nested key": (
        ["train", "--config", TRAIN_YAML, "stages.0.max_updatez=3"],
        2,
        ("stages.0.max_updatez", "max_updates"),
    ),
    "train: wrong type": (
        ["train", "--config", TRAIN_YAML, "pg.lr=fast"],
        2,
        ("pg.lr", "float", "valid keys under pg"),
    ),
    "train: missing list item": (
        ["train", "--config", TRAIN_YAML, "stages.9.max_updates=3"],
        2,
        ("stages.9",),
    ),
    "train: not KEY=VALUE": (["train", "--config", TRAIN_YAML, "lr"], 2, ("key.sub=value",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_error_is_one_line(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    if case.startswith("train"):
        pytest.importorskip("torch")
    argv, status, words = CASES[case]
    command = argv[0]
    line = _one_line_error(argv, capsys, status=status, command=command)
    for word in words:
        assert word in line, (word, line)


def test_train_config_file_with_unknown_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    config = tmp_path / "train.yaml"
    config.write_text(Path(TRAIN_YAML).read_text() + "\nsampler:\n  staleness: 1\n  stalenes: 2\n")
    line = _one_line_error(["train", "--config", str(config)], capsys, status=2, command="train")
    assert "sampler.stalenes" in line
    assert "staleness" in line
    bad = tmp_path / "bad.yaml"
    bad.write_text("scenario: [\n")
    line = _one_line_error(["train", "--config", str(bad)], capsys, status=2, command="train")
    assert "YAML" in line


def test_busy_listen_port(busy_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "collaboration/referential-v0", "--agents", "scripted,remote"]
    argv += ["--listen", f"tcp://127.0.0.1:{busy_port}", "--join-timeout", "2"]
    line = _one_line_error(argv, capsys, status=1, command="run")
    assert str(busy_port) in line
    assert "in use" in line


@pytest.mark.timeout(180)
def test_busy_serve_http_port(
    busy_port: int, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--model", str(tiny_model_dir), "--backend", "transformers"]
    argv += ["--listen", f"tcp://127.0.0.1:{_free_port()}", "--http", f"127.0.0.1:{busy_port}"]
    line = _one_line_error(argv, capsys, status=1, command="serve")
    assert str(busy_port) in line
    assert "address already in use" in line.lower()


@pytest.mark.timeout(180)
def test_unreachable_pool_is_named(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    argv = ["run", "negotiation/simple-trade-v1", "--episodes", "1", "--no-progress"]
    argv += ["--agents", f"llm:{tiny_model_dir},scripted", "--pool", address]
    line = _one_line_error(argv, capsys, status=2, command="run")
    assert address in line
    assert "parley serve" in line


def test_errors_in_a_real_process(tmp_path: Path) -> None:
    """The console script, piped: the line is whole (not wrapped at 80 columns), status 2."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PARLEY_DEBUG")}
    deep = tmp_path / ("a-rather-long-directory-name-" * 3)
    deep.mkdir()
    (deep / "out").write_text("a file, not a directory")
    parley = Path(sys.executable).with_name("parley")
    cmd = [str(parley), *RUN, "--out", str(deep / "out" / "x")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("parley run: cannot write to --out")
    assert str(deep) in line
    assert len(line) > 80


def test_error_lines_are_never_empty_and_unknown_os_errors_stay_bugs() -> None:
    import errno

    from parley.arena.cli.common import user_error_status

    status = user_error_status(TimeoutError())  # asyncio.wait_for's: no message at all
    assert status is not None
    assert status[1].startswith("timed out")
    assert user_error_status(OSError(errno.EPIPE, "Broken pipe")) is None  # a traceback
    busy = user_error_status(OSError(errno.EADDRINUSE, "Address already in use"))
    assert busy is not None
    assert "another process" in busy[1]
