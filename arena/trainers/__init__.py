"""Multi-agent policy-gradient trainers: advantages, the PG update, weight sync, the loop."""
