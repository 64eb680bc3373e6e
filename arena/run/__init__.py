"""The arena runner: plays episodes of a scenario with agents in seats.

Owns:

- :mod:`~parley.arena.run.runner` — ``Runner``, ``run``: concurrency, failures as data;
- :mod:`~parley.arena.run.episode` — episode plans, seeds, the per-episode log;
- :mod:`~parley.arena.run.gather` — awaiting every acting seat's request together;
- :mod:`~parley.arena.run.backpressure` — bus bounds sized for a run, retries of
  ``overloaded`` requests, failure reasons;
- :mod:`~parley.arena.run.direct` — in-process agents asked without the bus hops;
- :mod:`~parley.arena.run.process` — the play clock, and the GC freeze of the heap a run
  starts with;
- :mod:`~parley.arena.run.agent_host` — hosts agents in-process or in another process
  (``join_arena``); :mod:`~parley.arena.run.agent_specs` — ``scripted``, ``module:Class``,
  ``llm:PATH`` … seat specs;
- :mod:`~parley.arena.run.config` — ``RunConfig``, loadable from YAML;
- :mod:`~parley.arena.run.league` — tournaments (``parley tournament``): schedules, paired
  deals, resume, the cross-play matrix and ratings;
- :mod:`~parley.arena.run.suites` — benchmark suites (``parley eval``): named, versioned
  suites as data, their digest, resume, the report and Welch comparisons;
- :mod:`~parley.arena.run.records` — transcripts, trajectories and timings as JSONL (schema
  in ``SCHEMA.md`` beside this file); :mod:`~parley.arena.run.summary` and
  :mod:`~parley.arena.run.stats` — metrics tables with confidence intervals, built one
  record at a time in bounded memory.

May import: ``parley.protocols``, ``parley.scenarios``, ``parley.agents``. Nothing else of
``parley.arena`` (the ``llm:`` agent kind is resolved by its dotted name at run time, so the
runner does not depend on the inference pool).
"""
