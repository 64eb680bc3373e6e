"""Tests of parley.arena.training."""
