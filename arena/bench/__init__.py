"""``parley bench``: each benchmark prints our path beside the reference path, as ratios.

One module per subject: :mod:`~parley.arena.bench.bus` (the bus against raw pyzmq),
:mod:`~parley.arena.bench.env` (scenario steps through the runner against direct calls),
:mod:`~parley.arena.bench.pool` (the pool against direct backend calls),
:mod:`~parley.arena.bench.sampler` (asynchronous against synchronous sampling) and
:mod:`~parley.arena.bench.sandbox` (the tool sandbox).

May import: ``parley.protocols``, ``parley.scenarios``, ``parley.agents``,
:mod:`parley.arena.run`, :mod:`parley.arena.inference` and :mod:`parley.arena.training`.
"""
