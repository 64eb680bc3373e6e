"""``python -m parley.arena.cli`` is the ``parley`` command."""

from parley.arena.cli import main

raise SystemExit(main())
