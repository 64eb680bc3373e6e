"""Scripted researchers for ``tool_use/research-team-v0``: a cooperative baseline and contrasts.

:class:`Researcher` plays either seat through the public interface only (its view, tool
results, the teammate's messages): it follows the question's chain of relations, looks up
the entity it needs in its own half (``search`` for the name, ``open`` of the hit whose title
is exactly that name), sends what the article says to its teammate as one line
``About NAME: Key: value; Key: value``, reads such lines from its teammate, and answers once
the chain is resolved. A pair of them answers every question (two hops, one in each half).

:class:`FrequentGuesser` answers at once with the place named most often in its own half's
search results (the reward-hacking suite's "guess a frequent entity" contrast).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from parley.agents.scripted.base import ScriptedAgent
from parley.protocols.messages import Observation
from parley.scenarios.tools.corpus import RELATIONS

__all__ = ["FrequentGuesser", "Researcher", "article_facts"]

_ABOUT = re.compile(r"^About (.+?): (.*)$")
_KEYS = {key: relation for relation, (_, key) in RELATIONS.items()}


def article_facts(text: str) -> dict[str, str]:
    """The ``Key: value`` fact lines of an article, as relation -> value."""
    facts: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in _KEYS:
            facts[_KEYS[key]] = value.strip()
    return facts


def _view(observation: Observation) -> dict[str, Any]:
    view = observation.info.get("view", {})
    return view if isinstance(view, dict) else {}


class Researcher(ScriptedAgent):
    """Follows the chain with its teammate (module docstring); never privileged."""

    name = "researcher"

    def new_episode(self) -> None:
        self.facts: dict[str, dict[str, str]] = {}
        self.searched: set[str] = set()

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        message = self._read(view)
        entity, done = str(view.get("subject", "")), True
        for relation in view.get("chain", []):
            value = self.facts.get(entity, {}).get(str(relation))
            if value is None:
                done = False
                break
            entity = value
        move: dict[str, Any] = {"message": message} if message else {}
        hit = None if done else _hit_titled(view, entity)
        if done:
            move["answer"] = entity
        elif hit is not None:
            move["tool_calls"] = [{"name": "open", "arguments": {"doc_id": hit}}]
        elif entity not in self.searched:
            self.searched.add(entity)
            move["tool_calls"] = [{"name": "search", "arguments": {"query": entity, "k": 3}}]
        return json.dumps(move)

    def _read(self, view: dict[str, Any]) -> str:
        """Learn from tool results and messages; the message to send (or "")."""
        for text in view.get("messages", []):
            found = _ABOUT.match(str(text))
            if found:
                facts = article_facts(found.group(2).replace("; ", "\n"))
                self.facts.setdefault(found.group(1), {}).update(facts)
        message = ""
        for result in view.get("tool_results", []):
            if result.get("name") == "open" and not result.get("error"):
                title, _, body = str(result.get("content", "")).partition("\n")
                facts = article_facts(body)
                self.facts.setdefault(title, {}).update(facts)
                message = f"About {title}: " + "; ".join(
                    f"{RELATIONS[rel][1]}: {value}" for rel, value in facts.items()
                )
        return message


def _hit_titled(view: dict[str, Any], title: str) -> str | None:
    """The doc id of a hit titled exactly ``title`` in this turn's search results."""
    for result in view.get("tool_results", []):
        if result.get("name") == "search" and not result.get("error"):
            for hit in json.loads(str(result.get("content", "[]"))):
                if hit.get("title") == title:
                    return str(hit["doc_id"])
    return None


class FrequentGuesser(ScriptedAgent):
    """Searches once, then answers with the place its hits' snippets name most often (a
    contrast for the reward-hacking suite: it must score near chance)."""

    name = "frequent-guesser"

    def new_episode(self) -> None:
        self.asked = False

    def decide(self, observation: Observation) -> str:
        view = _view(observation)
        if not self.asked:
            self.asked = True
            search = {"name": "search", "arguments": {"query": "town organisation", "k": 10}}
            return json.dumps({"tool_calls": [search]})
        words: Counter[str] = Counter()
        for result in view.get("tool_results", []):
            for hit in json.loads(str(result.get("content") or "[]")):
                words.update(re.findall(r"\b(?:in|on|of) ([A-Z][a-z]+)\b", hit["snippet"]))
        guess = words.most_common(1)[0][0] if words else "unknown"
        return json.dumps({"answer": guess})
