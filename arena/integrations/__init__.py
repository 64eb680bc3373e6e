"""Integrations: parley scenarios played online by outside trainers' environment contracts.

Owns the *learner seat* adapter (:mod:`~parley.arena.integrations.learner`: an outside
trainer plays one or more named seats of any registered scenario, parley plays the others
through the episode runner) and the servers that expose it in a framework's own protocol
(:mod:`~parley.arena.integrations.openenv`: OpenEnv's HTTP/WebSocket environment contract),
and TRL's ``GRPOTrainer`` ``rollout_func`` (:mod:`~parley.arena.integrations.trl_env`: the
trainer's own model plays the learner seat, exact ids per turn).

May import ``parley.protocols``, ``parley.scenarios``, ``parley.agents`` and
``parley.arena.run`` (``trl_env`` also ``parley.arena.inference``: its transformers
backend decodes with the trainer's model); the frameworks themselves (``openenv``,
``datasets``) only inside the modules that speak their protocol, so importing this package
costs none of them. Nothing in parley imports it except the CLI (``parley env-server``).
"""
