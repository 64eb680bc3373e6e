"""Write ``catalog.json``, the built-in scenarios' specs, from their ``@registered`` classes.

Run ``python -m parley.scenarios.catalog`` after adding a version or changing a decorator's
baselines or description: :mod:`parley.scenarios.registry` reads the file, so that listing
the scenarios imports none of their modules.
"""

from __future__ import annotations

import json

from parley.scenarios.registry import CATALOG, builtin_specs, catalog_entry


def render() -> str:
    """The text ``catalog.json`` must hold for the scenario classes as they are now."""
    return json.dumps([catalog_entry(s) for s in builtin_specs()], indent=2) + "\n"


def main() -> None:
    """Rewrite :data:`parley.scenarios.registry.CATALOG` and say how many specs it holds."""
    text = render()
    CATALOG.write_text(text, encoding="utf-8")
    print(f"wrote {CATALOG} ({len(json.loads(text))} scenarios)")


if __name__ == "__main__":
    main()
