"""Negotiation scenarios: players with private interests bargain over a division."""
