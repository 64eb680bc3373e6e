"""Integrations: parley scenarios played online by outside trainers' environment contracts.

Owns the *learner seat* adapter (:mod:`~parley.arena.integrations.learner`: an outside
trainer plays one or more named seats of any registered scenario, parley plays the others
through the episode runner) and the servers that expose it in a framework's own protocol
(:mod:`~parley.arena.integrations.openenv`: OpenEnv's HTTP/WebSocket environment contract).

May import ``parley.protocols``, ``parley.scenarios``, ``parley.agents`` and
``parley.arena.run``; the frameworks themselves (``openenv``) only inside the modules that
speak their protocol, so importing this package costs none of them. Nothing in parley
imports it except the CLI (``parley env-server``).
"""
