"""Tests of parley.arena.run."""
