"""Train ``examples/referential.yaml`` on several seeds and evaluate each team greedily.

    python examples/referential_seeds.py --seeds 0-9 --out runs/ref-seeds

``examples/recipe_seeds.py`` with the referential recipe as its config and 0.9 greedy
success as the pass mark: one run per seed, each followed by a greedy arena evaluation of
its checkpoints on 400 episodes; the table goes to ``OUT/seeds.md``, the rows to
``OUT/seeds.json`` (a seed already there is skipped). Extra ``key=value`` arguments
override the config for every seed (``pg.lr=3e-3``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: recipe_seeds beside it

from recipe_seeds import main

CONFIG = Path(__file__).with_name("referential.yaml")

if __name__ == "__main__":
    raise SystemExit(main(config=CONFIG, pass_at=0.9))
