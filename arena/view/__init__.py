"""The viewer behind ``parley view`` and the human seat behind ``--agents human``.

Owns: reading run folders (``parley run`` and ``parley train`` outputs) for display
(:mod:`~parley.arena.view.data`), the HTML pages (:mod:`~parley.arena.view.pages`,
:mod:`~parley.arena.view.episode`, the tournament page :mod:`~parley.arena.view.league`, the
``parley eval`` report page :mod:`~parley.arena.view.evals`), the
aiohttp server with its live training feed and the
static export (:mod:`~parley.arena.view.server`), and the browser seat for a person
(:mod:`~parley.arena.view.human`). Pages, CSS and scripts ship in ``static/``: no frontend
build step. Agent text is hostile: every page escapes it, scripts only ever set
``textContent``, and URLs name runs by id (never by path), so no URL reaches a file outside
the run folders.

May import ``parley.protocols``, ``parley.scenarios``, ``parley.agents``,
``parley.arena.run`` and ``parley.arena.training`` (it reads their outputs; it never writes
them). Nothing in ``parley.arena`` imports it except the CLI and the ``human`` agent kind
(registered lazily by name in :data:`parley.arena.run.agent_specs.AGENT_KINDS`).
"""
