"""Tests of parley.arena.inference."""
