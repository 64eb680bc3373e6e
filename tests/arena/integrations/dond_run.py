"""What the trainer integrations' tests replay: ``parley run`` of deal-or-no-deal-v3, whose
player_0 moves a trainer's trajectories play again and whose returns they must score."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
DOND = "negotiation/deal-or-no-deal-v3"
SEAT = "player_0"


def parley_run(out: Path, episodes: int, seed: int) -> list[dict[str, Any]]:
    """The transcripts of ``parley run DOND --episodes N --seed S`` (a real process)."""
    cmd = [str(BIN / "parley"), "run", DOND, "--episodes", str(episodes), "--seed", str(seed)]
    cmd += ["--no-progress", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
