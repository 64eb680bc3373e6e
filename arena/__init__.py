"""Where it runs: one folder per concern, dependencies pointing one way.

``run`` ← ``inference`` ← ``training`` ← ``bench`` ← ``cli`` (a folder may import those left
of it; ``tests/test_layout.py`` checks it):

- :mod:`parley.arena.run` — the arena runner: episodes of a scenario with agents in seats,
  agent hosts (in-process and remote), run config, output records, summary and statistics.
- :mod:`parley.arena.inference` — the inference pool, its backends (transformers, vLLM,
  OpenAI-compatible HTTP), the OpenAI-compatible HTTP front, the tiny model the tests build,
  and the ``llm:`` agent spec that connects LLM agents to a pool.
- :mod:`parley.arena.training` — the asynchronous sampler, advantage estimators, the
  policy-gradient trainer, weight sync, warm starts, the training loop and trajectory export.
- :mod:`parley.arena.bench` — ``parley bench``: our path beside the reference path, as ratios.
- :mod:`parley.arena.cli` — the ``parley`` command line, one module per subcommand, and the
  demo (``parley demo``).

This package and its folders' ``__init__`` modules import nothing on purpose: ``parley`` (the
CLI) lives here, and every command would otherwise pay for importing the runner, the pool and
the trainers. Import from the modules, e.g. :class:`parley.arena.run.runner.Runner`,
:class:`parley.arena.inference.pool.InferencePool`,
:class:`parley.arena.training.sampler.AsyncSampler`.
"""


def __getattr__(name: str) -> str:
    # Kept for code written before ``parley.__version__`` existed.
    if name == "__version__":
        import parley

        return str(parley.__version__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
