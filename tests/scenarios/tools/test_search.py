"""The search tool (SQLite FTS5 BM25) and the generated encyclopedia it indexes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from parley.protocols.errors import ConfigError
from parley.protocols.messages import ToolCall, ToolResult
from parley.scenarios.tools.corpus import (
    RELATIONS,
    Document,
    generate_world,
    load_directory,
    render_document,
)
from parley.scenarios.tools.search import (
    MAX_K,
    MAX_OPEN_CHARS,
    MAX_TERMS,
    SearchIndex,
    fts_query,
)
from parley.scenarios.tools.tool import ToolFailure


def _world_index(seed: int = 0) -> SearchIndex:
    world = generate_world(np.random.default_rng(seed))
    docs = [render_document(e, f"d{i}") for i, e in enumerate(world.entities.values())]
    return SearchIndex(docs)


def _call(index: SearchIndex, name: str, **arguments: object) -> ToolResult:
    return index.tools().call(ToolCall(call_id="c", name=name, arguments=json.dumps(arguments)))


def test_search_ranks_the_article_about_the_name_first_and_open_reads_it() -> None:
    world = generate_world(np.random.default_rng(3))
    entities = list(world.entities.values())
    index = SearchIndex([render_document(e, f"d{i}") for i, e in enumerate(entities)])
    for entity in entities:
        hits = index.search(entity.name, k=3)
        assert hits[0]["title"] == entity.name, (entity.name, hits)
        text = index.open(hits[0]["doc_id"])
        assert text.splitlines()[0] == entity.name
        for relation, value in entity.facts.items():
            assert f"{RELATIONS[relation][1]}: {value}" in text


# FTS5 syntax that raises "fts5: syntax error" when passed through, operators, column filters,
# NUL bytes and other control characters, a megabyte of text.
HOSTILE_QUERIES = [
    '"',
    'a" OR "b',
    "AND",
    "a OR",
    "NEAR(a b",
    "title:x",
    "text : x",
    "*",
    "x*",
    "(",
    ")",
    "-x",
    "^a",
    "a + b",
    "{title text}: x",
    "a\x00b",
    "\x00" * 100,
    "\ud800",
    "é 交渉 🤝",
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("query", HOSTILE_QUERIES)
def test_hostile_queries_never_reach_fts5_as_syntax(query: str) -> None:
    index = _world_index()
    result = _call(index, "search", query=query, k=5)
    if result.error:  # only "no words": never an FTS5 error
        assert "no words" in result.error, result.error
    else:
        assert isinstance(json.loads(result.content), list)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"query": "x" * 999_000}, "at most 500 characters"),
        ({"query": "x" * 1_000_000}, "at most 1000000"),
        ({"query": "town", "k": 10**18}, f"at most {MAX_K}"),
        ({"query": "town", "k": 0}, "at least 1"),
        ({"query": "town", "k": -5}, "at least 1"),
        ({"query": "town", "k": "5"}, "must be integer"),
        ({"query": ""}, "no words"),
        ({"query": "  ;;; \n"}, "no words"),
        ({"query": ["town"]}, "must be string"),
        ({}, "query is required"),
        ({"query": "town", "filter": "title"}, "not a parameter"),
    ],
)
def test_bad_search_arguments_are_tool_errors_that_say_what_to_send(
    arguments: dict[str, object], reason: str
) -> None:
    result = _call(_world_index(), "search", **arguments)
    assert result.error, result
    assert reason in result.error, result


def test_search_called_directly_bounds_its_own_arguments() -> None:
    index = _world_index()
    with pytest.raises(ToolFailure, match="at most 500"):
        index.search("town " * 200_000)
    with pytest.raises(ToolFailure, match="between 1 and 10"):
        index.search("town", k=10**9)


def test_a_query_of_any_length_searches_at_most_max_terms_quoted_words() -> None:
    words = " ".join(f"w{i}" for i in range(100_000))
    match = fts_query(words + ' " OR NEAR( title:x')
    assert match.count('"') == 2 * MAX_TERMS
    assert match.split(" OR ")[:2] == ['"w0"', '"w1"']
    # Quotes are separators and operators plain words, searched as such.
    assert fts_query('x" OR "y') == '"x" OR "or" OR "y"'
    assert fts_query("a\x00b") == '"a" OR "b"'


def test_open_refuses_unknown_ids_and_cuts_long_documents() -> None:
    index = SearchIndex([Document("long", "Long", "Long\n" + "word " * 5000)])
    assert "no document" in str(_call(index, "open", doc_id="nope").error)
    assert "at most 64" in str(_call(index, "open", doc_id="x" * 10_000).error)
    text = index.open("long")
    assert len(text) < MAX_OPEN_CHARS + 40
    assert text.endswith("more]")


def test_two_indexes_share_nothing() -> None:
    a = SearchIndex([Document("a1", "Alpha", "Alpha\nonly in a")])
    b = SearchIndex([Document("b1", "Beta", "Beta\nonly in b")])
    assert [h["doc_id"] for h in a.search("only")] == ["a1"]
    a.close()
    assert [h["doc_id"] for h in b.search("only")] == ["b1"]


def test_worlds_are_pure_in_the_seed_with_consistent_cross_references() -> None:
    def dump(seed: int) -> str:
        world = generate_world(np.random.default_rng(seed))
        return json.dumps([(e.kind, e.name, e.facts) for e in world.entities.values()])

    assert dump(7) == dump(7)
    assert dump(7) != dump(8)
    for seed in range(20):
        world = generate_world(np.random.default_rng(seed))
        kinds = {name: e.kind for name, e in world.entities.items()}
        for entity in world.entities.values():
            for relation, value in entity.facts.items():
                target = {"birthplace": "place", "employer": "organisation",
                          "founder": "person", "headquarters": "place", "venue": "place",
                          "organiser": "organisation"}.get(relation)  # fmt: skip
                if target is not None:
                    assert kinds.get(value) == target, (seed, entity.name, relation, value)


def test_a_user_corpus_directory_is_indexed_and_a_missing_one_says_what_to_give(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.md").write_text("Zorblax treaty\nSigned on a rainy day.\n")
    (tmp_path / "ignored.bin").write_bytes(b"\x00\x01")
    docs = load_directory(tmp_path)
    assert [(d.doc_id, d.title) for d in docs] == [("user:0", "Zorblax treaty")]
    assert SearchIndex(docs).search("rainy treaty")[0]["title"] == "Zorblax treaty"
    with pytest.raises(ConfigError, match=r"directory of \.txt or \.md"):
        load_directory(tmp_path / "missing")
