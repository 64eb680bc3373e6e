"""A league replays the matches of an agent changed in place (same spec string: a model folder
retrained, an agent's source file edited) and resumes every other match (league.py,
agent_specs.agent_fingerprint)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspiel")

from parley.arena.run.agent_specs import FULL_HASH_BYTES, folder_fingerprint
from parley.arena.run.league import LeagueConfig, play_league
from parley.protocols.errors import ConfigError

BASELINES = {
    "rand": "parley.agents.scripted.imported:RandomLegal",
    "first": "parley.agents.scripted.imported:FirstLegal",
}
AGENT = """from parley.agents.scripted.imported import {base}


class Mine({base}):
    pass
"""


def _league(tmp_path: Path, agents: dict[str, str], lines: list[str]) -> dict:
    config = LeagueConfig(
        agents=agents, scenarios=["openspiel:tic_tac_toe"], out=str(tmp_path / "league"),
        games_per_pair=2,
    )  # fmt: skip
    return play_league(config, log=lines.append)


def _played(lines: list[str]) -> set[str]:
    return {line.split()[1].rstrip(":") for line in lines if line.startswith("played")}


def _resumed(lines: list[str]) -> set[str]:
    return {line.split()[1] for line in lines if line.startswith("resumed")}


def _new_process() -> None:
    """Forget the agent files this process imported, as a new ``parley tournament`` would."""
    for name in [name for name in sys.modules if name.startswith("parley_file_mine_")]:
        del sys.modules[name]


@pytest.mark.timeout(120)
def test_an_agent_whose_code_changed_plays_its_matches_again(tmp_path: Path) -> None:
    source = tmp_path / "mine.py"
    source.write_text(AGENT.format(base="FirstLegal"))
    agents = {**BASELINES, "mine": f"{source}:Mine"}
    first: list[str] = []
    whole = _league(tmp_path, agents, first)
    matches = {p.name for p in (tmp_path / "league" / "matches").iterdir()}
    assert _played(first) == matches
    assert len(matches) == 6  # 3 pairs, both sides

    _new_process()
    unchanged: list[str] = []
    again = _league(tmp_path, agents, unchanged)
    assert _resumed(unchanged) == matches
    assert not _played(unchanged)
    assert again["games"] == whole["games"]

    source.write_text(AGENT.format(base="RandomLegal"))  # same spec, new code
    _new_process()
    changed: list[str] = []
    _league(tmp_path, agents, changed)
    assert (
        changed.count("agent mine changed since its matches were played: playing them again") == 1
    )
    assert _played(changed) == {name for name in matches if "mine" in name}
    assert _resumed(changed) == {name for name in matches if "mine" not in name}
    assert {p.name for p in (tmp_path / "league" / "matches").iterdir()} == matches  # same keys

    _new_process()
    after: list[str] = []
    _league(tmp_path, agents, after)
    assert _resumed(after) == matches


@pytest.mark.timeout(300)
def test_a_model_retrained_in_place_plays_its_matches_again(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    agents = {**BASELINES, "llm": f"llm:{model}?max_tokens=4"}
    first: list[str] = []
    _league(tmp_path, agents, first)
    matches = {p.name for p in (tmp_path / "league" / "matches").iterdir()}
    assert _played(first) == matches

    unchanged: list[str] = []
    _league(tmp_path, agents, unchanged)
    assert _resumed(unchanged) == matches
    assert not _played(unchanged)

    # "Retrained": new weights written over the old file, same names and shapes.
    [weights] = model.glob("*.safetensors")
    tensors = load_file(weights)
    tensors = {name: t + 0.01 * torch.ones_like(t) for name, t in tensors.items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    changed: list[str] = []
    _league(tmp_path, agents, changed)
    assert changed.count("agent llm changed since its matches were played: playing them again") == 1
    assert _played(changed) == {name for name in matches if "llm" in name}
    assert _resumed(changed) == {name for name in matches if "llm" not in name}

    shutil.move(model, tmp_path / "elsewhere")  # the folder vanished: said, not replayed
    with pytest.raises(ConfigError, match=r"its model folder .* is gone"):
        _league(tmp_path, agents, [])


@pytest.mark.timeout(120)
def test_an_agent_that_edits_its_own_file_while_playing_is_replayed_next_run(
    tmp_path: Path,
) -> None:
    source = tmp_path / "mine.py"
    source.write_text(
        AGENT.format(base="FirstLegal").replace(
            "    pass\n",
            "    def decide(self, observation):\n"
            "        with open(__file__, 'a') as f:\n"
            "            f.write('# again\\n')\n"
            "        return super().decide(observation)\n",
        )
    )
    agents = {**BASELINES, "mine": f"{source}:Mine"}
    first: list[str] = []
    _league(tmp_path, agents, first)
    # This process plays on with the code it imported (and fingerprinted) at the start ...
    matches = {p.name for p in (tmp_path / "league" / "matches").iterdir()}
    assert _played(first) == matches
    assert not any(line.startswith("agent ") for line in first)
    # ... which the next one replaces.
    _new_process()
    again: list[str] = []
    _league(tmp_path, agents, again)
    assert _played(again) == {name for name in matches if "mine" in name}


def test_a_model_folder_fingerprint_follows_content_symlinks_and_big_files(
    tmp_path: Path,
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for folder, text in ((one, "a"), (two, "b")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    link = tmp_path / "current"
    link.symlink_to(one)
    before = folder_fingerprint(link)
    assert before == folder_fingerprint(one)
    link.unlink()
    link.symlink_to(two)  # retargeted: another model
    assert folder_fingerprint(link) != before

    big = one / "model.safetensors"  # past the whole-file cap: size, mtime and samples
    big.write_bytes(bytes(FULL_HASH_BYTES + 10))
    sampled = folder_fingerprint(one)
    stat = big.stat()
    with big.open("r+b") as f:
        f.seek(stat.st_size // 2)
        f.write(b"\1")
    os.utime(big, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime: the sample sees it
    assert folder_fingerprint(one) != sampled
    sampled = folder_fingerprint(one)
    (one / ".hidden").write_text("x")  # hidden files and subfolders do not count
    (one / "checkpoint-1").mkdir()
    (one / "checkpoint-1" / "model.safetensors").write_text("older")
    assert folder_fingerprint(one) == sampled
    big.touch()  # rewritten (a new mtime), even with the same bytes: played again
    assert folder_fingerprint(one) != sampled


@pytest.mark.timeout(120)
def test_parley_tournament_says_which_agent_changed_and_refuses_a_vanished_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from parley.arena.cli import main

    source = tmp_path / "mine.py"
    source.write_text(AGENT.format(base="FirstLegal"))
    out = str(tmp_path / "league")
    args = ["tournament", "--scenarios", "openspiel:tic_tac_toe", "--games-per-pair", "2"]
    args += ["--agents", f"base=scripted,mine={source}:Mine", "--out", out]
    assert main(args) == 0
    source.write_text(AGENT.format(base="RandomLegal"))
    _new_process()
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "agent mine changed since its matches were played: playing them again" in err
    assert "agent base changed" not in err
    source.unlink()
    _new_process()
    assert main(args) == 2
    assert "mine.py" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_a_league_played_before_fingerprints_resumes_and_records_them(tmp_path: Path) -> None:
    import json

    whole = _league(tmp_path, BASELINES, [])
    results = sorted((tmp_path / "league" / "matches").glob("*/result.json"))
    for result in results:  # as written before fingerprints were kept
        done = json.loads(result.read_text())
        del done["fingerprints"]
        result.write_text(json.dumps(done))
    runs = {r: (r.parent / "transcripts.jsonl").stat().st_mtime_ns for r in results}
    lines: list[str] = []
    again = _league(tmp_path, BASELINES, lines)
    assert runs == {r: (r.parent / "transcripts.jsonl").stat().st_mtime_ns for r in results}
    assert sum(line.startswith("scoring again") for line in lines) == len(results)
    assert again["games"] == whole["games"]
    assert all("fingerprints" in json.loads(r.read_text()) for r in results)
    lines.clear()
    _league(tmp_path, BASELINES, lines)
    assert len(_resumed(lines)) == len(results)


@pytest.mark.timeout(300)
def test_a_model_folder_written_while_the_league_plays_is_replayed_next_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # A training run writing into the folder while the league plays: the match that saw it
    # happen is recorded so that the next run plays the model's matches again.
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    writer = tmp_path / "writer.py"
    writer.write_text(
        AGENT.format(base="FirstLegal").replace(
            "    pass\n",
            "    def decide(self, observation):\n"
            f"        with open({str(model / 'notes.txt')!r}, 'a') as f:\n"
            "            f.write('step\\n')\n"
            "        return super().decide(observation)\n",
        )
    )
    agents = {"llm": f"llm:{model}?max_tokens=4", "writer": f"{writer}:Mine"}
    first: list[str] = []
    _league(tmp_path, agents, first)
    assert sum(line.startswith("agent llm changed while") for line in first) == 2  # 2 sides
    again: list[str] = []
    _league(tmp_path, agents, again)
    assert again[0] == "agent llm changed since its matches were played: playing them again"
    assert len(_played(again)) == 2
