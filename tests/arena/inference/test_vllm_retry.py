"""``VLLMBackend._one`` after an engine death: the rerun is not streamed (the sink got the
dead run's tokens already; a streamed rerun sent the text twice before the error event).

No engine is started: ``_run`` and ``_revive`` are replaced by a stand-in that streams a
token and dies once, so only ``_one``'s retry logic is under test (the real restart is
covered by test_vllm_restart.py)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm")
from vllm.v1.engine.exceptions import EngineDeadError

from parley.arena.inference.backends.vllm import VLLMBackend
from parley.protocols.messages import Completion, GenerateRequest, GenerateResult


class DiesOnce(VLLMBackend):
    def __init__(self) -> None:  # no engine: _one only needs _generation, _run, _revive
        self._generation = 0
        self.sinks: list[Any] = []
        self.revived = 0

    async def _run(
        self, request: GenerateRequest, version: int, sink: Any, lora: Any = None
    ) -> GenerateResult:
        self.sinks.append(sink)
        if sink is not None:
            sink(0, Completion(text="a", token_ids=[1]))
        if len(self.sinks) == 1:
            raise EngineDeadError("the engine process died")
        done = Completion(text="ab", token_ids=[1, 2])
        return GenerateResult(
            policy="p", policy_version=version, prompt_token_ids=[5], completions=[done]
        )

    async def _revive(self, generation: int, exc: BaseException) -> None:
        self.revived += 1
        self._generation += 1


async def test_the_rerun_after_an_engine_restart_is_not_streamed() -> None:
    backend = DiesOnce()
    got: list[str] = []
    result = await backend._one(
        GenerateRequest(prompt="x"), 0, sink=lambda i, c: got.append(c.text)
    )
    assert backend.revived == 1
    assert backend.sinks[1] is None
    assert got == ["a"]  # the dead run's token once, never the rerun's again
    assert result.completions[0].text == "ab"
