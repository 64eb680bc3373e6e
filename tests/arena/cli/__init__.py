"""Tests of parley.arena.cli."""
