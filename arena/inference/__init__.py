"""The inference service: one pool that batches every agent's generate requests.

Owns :mod:`~parley.arena.inference.pool` (``InferencePool``, ``PoolConfig``: batching,
routing by policy, versions, timeouts), :mod:`~parley.arena.inference.backends`
(transformers, vLLM, OpenAI-compatible HTTP behind one batch interface, structured-output
constraints, tokenizers), :mod:`~parley.arena.inference.http` (the OpenAI-compatible HTTP
front of ``parley serve``), :mod:`~parley.arena.inference.models` (the tiny model tests and
demos build) and :mod:`~parley.arena.inference.llm_spec` (the ``llm:`` agent kind).

May import: ``parley.protocols``, ``parley.scenarios``, ``parley.agents`` and
:mod:`parley.arena.run`. Heavy dependencies (torch, transformers, vLLM) are imported only
inside the backend that needs them.
"""
