"""Where it runs: the runner, the inference pool, sampling, training, the CLI.

This package imports nothing on purpose: ``parley`` (the CLI) lives here, and every command
would otherwise pay for importing the runner, the pool and the trainers. Import from the
modules:

- :mod:`parley.arena.runner` — ``Runner``, ``run``; :mod:`parley.arena.run_config` —
  ``RunConfig``, ``load_run_config``; :mod:`parley.arena.agent_host` — ``join_arena``.
- :mod:`parley.arena.pool` — ``InferencePool``, ``PoolConfig``;
  :mod:`parley.arena.backends` — ``Backend``, ``load_backend``; :mod:`parley.arena.http` —
  the OpenAI-compatible front.
- :mod:`parley.arena.sampler` — ``AsyncSampler``; :mod:`parley.arena.trainers` — the
  policy-gradient trainers and the training loop; :mod:`parley.arena.export`.
"""
