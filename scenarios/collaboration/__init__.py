"""Collaboration scenarios: a team shares one reward and must pool what each member knows."""
