"""Scripted baseline agents, at least one per seat of every built-in scenario.

Each class is constructed with no arguments and named in its scenario's registry spec
(``spec.baselines``). They read their own ``observation.info["view"]``.
"""
