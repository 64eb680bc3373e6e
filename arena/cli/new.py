"""``parley new``: write a ready package for a new scenario or agent.

``parley new scenario NAME [--kind turn-based|simultaneous|tool-use] [--family F] [--dir D]``
writes ``D/NAME/`` with

- ``pyproject.toml`` — the package, its ``parley.scenarios`` entry point (installed with
  ``pip install -e .``, ``parley list`` shows it and ``parley run F/NAME-v0`` plays it) and a
  pytest setting that puts the package on the path;
- ``PACKAGE/scenario.py`` — the scenario: one file whose module docstring is its doc page,
  rules as pure functions, state as a dataclass (a working game of the chosen kind: a race to 21
  taken in turns, rock-paper-scissors played simultaneously, or arithmetic with tools);
- ``PACKAGE/agents.py`` — its scripted baseline; ``PACKAGE/__init__.py`` — its spec;
- ``tests/test_PACKAGE.py`` — parley's conformance suite over the scenario and a baseline
  episode, passing as generated (``cd NAME && pytest``).

``parley new agent NAME`` writes ``PACKAGE/agent.py`` (an :class:`~parley.agents.base.Agent`
that answers any scenario, honouring ``choice`` constraints) and a test that seats it in a
built-in scenario. The templates live in :mod:`parley.arena.cli.new_templates` (and
:mod:`parley.arena.cli.new_tool_use`).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from parley.protocols.errors import ConfigError

KINDS = ("turn-based", "simultaneous", "tool-use")
_NAME = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("new", help="write a ready package for a new scenario or agent")
    parser.add_argument("what", choices=("scenario", "agent"), help="what to write")
    parser.add_argument("name", help="its name, lower case with - or _ (e.g. my-game)")
    parser.add_argument("--kind", choices=KINDS, default="turn-based", help="scenario kind")
    parser.add_argument("--family", default="custom", help="scenario id family (F/NAME-v0)")
    parser.add_argument("--dir", default=".", help="where to create the NAME folder")
    parser.add_argument("--force", action="store_true", help="write into an existing folder")
    parser.set_defaults(func=run)


def names(name: str) -> dict[str, str]:
    """The placeholders of the templates for ``name`` (``my-game``): ``NAME``, ``PACKAGE``
    (``my_game``) and ``CLASS`` (``MyGame``)."""
    if not _NAME.match(name):
        raise ConfigError(
            f"name {name!r} must be lower case letters and digits, words joined by - or _ "
            "(e.g. my-game)"
        )
    words = re.split("[-_]", name)
    return {"NAME": name, "PACKAGE": "_".join(words), "CLASS": "".join(w.title() for w in words)}


def render(template: str, values: dict[str, str]) -> str:
    """``template`` with every ``<<KEY>>`` replaced by ``values[KEY]``."""
    return re.sub(r"<<(\w+)>>", lambda m: values[m.group(1)], template)


def files_for(what: str, name: str, kind: str, family: str) -> dict[str, str]:
    """Relative path -> text of every file of the package (nothing written)."""
    from parley.arena.cli import new_templates as t

    values = names(name)
    if not re.match(r"^[a-z0-9_]+$", family):
        raise ConfigError(f"family {family!r} must be lower case letters, digits and _")
    values["ID"] = f"{family}/{values['NAME'].replace('_', '-')}-v0"
    pkg = values["PACKAGE"]
    if what == "agent":
        layout = {
            "pyproject.toml": t.AGENT_PYPROJECT,
            f"{pkg}/__init__.py": t.AGENT_INIT,
            f"{pkg}/agent.py": t.AGENT,
            f"tests/test_{pkg}.py": t.AGENT_TEST,
        }
    else:
        scenario, baseline = t.SCENARIOS[kind]
        layout = {
            "pyproject.toml": t.SCENARIO_PYPROJECT,
            f"{pkg}/__init__.py": t.SCENARIO_INIT,
            f"{pkg}/scenario.py": scenario,
            f"{pkg}/agents.py": baseline,
            f"tests/test_{pkg}.py": t.SCENARIO_TEST,
        }
    return {path: render(text, values) for path, text in layout.items()}


def write_package(
    what: str, name: str, *, kind: str = "turn-based", family: str = "custom",
    where: str | Path = ".", force: bool = False,
) -> Path:  # fmt: skip
    """Write the package into ``where/NAME``; returns that folder. Refuses an existing
    folder unless ``force`` (nothing is overwritten silently)."""
    root = Path(where) / name
    files = files_for(what, name, kind, family)
    if root.exists() and not force:
        raise ConfigError(f"{root} exists; choose another name or --dir, or pass --force")
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


def run(args: argparse.Namespace) -> int:
    root = write_package(
        args.what, args.name, kind=args.kind, family=args.family, where=args.dir,
        force=args.force,
    )  # fmt: skip
    values = names(args.name)
    print(f"wrote {root}/ ({args.what}{'' if args.what == 'agent' else ', ' + args.kind})")
    print(f"  cd {root} && pytest            # the conformance suite, passing as generated")
    if args.what == "scenario":
        module = f"{values['PACKAGE']}/scenario.py:{values['CLASS']}V0"
        print(f"  cd {root} && PYTHONPATH=. parley run {module}   # play it, not installed")
        print(f"  pip install -e {root} && parley list --family {args.family}")
    else:
        agent = f"{root}/{values['PACKAGE']}/agent.py:{values['CLASS']}"
        print(f"  parley run negotiation/simple-trade-v2 --agents {agent},scripted")
    return 0
