"""A search engine over a local full-text index: SQLite FTS5 with BM25 ranking.

:class:`SearchIndex` indexes :class:`~parley.scenarios.tools.corpus.Document` values in an
in-memory SQLite database of its own (one per index: concurrent episodes share nothing) and
offers two tools through :meth:`SearchIndex.tools`:

- ``search(query, k)`` — the ``k`` best documents for ``query`` by BM25 (title hits weigh
  more than body hits), as ``[{"doc_id", "title", "snippet"}]``;
- ``open(doc_id)`` — the text of one document, cut to :data:`MAX_OPEN_CHARS`.

Bounds (a query is policy output, so hostile): the query is at most :data:`MAX_QUERY_CHARS`
characters and ``k`` at most :data:`MAX_K` (the tool schema refuses more, as a tool error).
FTS5 query syntax is never passed through: the query is split into words (letters and digits;
NUL bytes, quotes, ``*``, ``NEAR``, parentheses and column filters are just separators or
words), at most :data:`MAX_TERMS` distinct words of at most :data:`MAX_TERM_CHARS` characters
are kept, and each is quoted as a phrase of its own, joined by ``OR``. So a query has a fixed
shape whose cost is bounded by the corpus size, and no input raises an FTS5 syntax error.
A query with no word is a tool error that says what to send.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from typing import Any

from parley.scenarios.tools.corpus import Document
from parley.scenarios.tools.tool import Tool, ToolBox, ToolFailure, tool

__all__ = [
    "MAX_K",
    "MAX_OPEN_CHARS",
    "MAX_QUERY_CHARS",
    "MAX_TERMS",
    "MAX_TERM_CHARS",
    "SearchIndex",
    "fts_query",
]

MAX_QUERY_CHARS = 500
"""Longest query the ``search`` tool takes."""
MAX_K = 10
"""Most results one ``search`` call returns."""
MAX_TERMS = 12
"""Most distinct words of a query that are searched (the rest are ignored)."""
MAX_TERM_CHARS = 40
"""Longest word searched; a longer one is cut."""
MAX_OPEN_CHARS = 4000
"""Longest document text ``open`` returns (the rest is cut, with a note)."""
_SNIPPET_CHARS = 160
_WORD = re.compile(r"[^\W_]+")
# BM25 column weights (title, text): a hit in the title ranks a document as being *about* it.
_RANK = "bm25(docs, 5.0, 1.0)"


def fts_query(query: str) -> str:
    """The FTS5 query for ``query``: its distinct words, each quoted, joined by ``OR``
    ("" when it has none). Never FTS5 syntax from the caller (module docstring)."""
    terms: list[str] = []
    for word in _WORD.findall(query.lower()):
        word = word[:MAX_TERM_CHARS]
        if word not in terms:
            terms.append(word)
        if len(terms) == MAX_TERMS:
            break
    return " OR ".join(f'"{term}"' for term in terms)


class SearchIndex:
    """A BM25 full-text index over ``documents`` (an in-memory SQLite FTS5 table).

    Building one is cheap (about a millisecond for a hundred short articles). Document ids
    must be unique. The index is owned by one scenario instance; :meth:`close` frees it.
    """

    def __init__(self, documents: Sequence[Document]) -> None:
        # check_same_thread=False: a runner may step a scenario from a worker thread; the
        # index is still used by one episode at a time.
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute("CREATE VIRTUAL TABLE docs USING fts5(doc_id UNINDEXED, title, text)")
        self._db.executemany(
            "INSERT INTO docs (doc_id, title, text) VALUES (?, ?, ?)",
            [(d.doc_id, d.title, d.text) for d in documents],
        )
        self._by_id = {d.doc_id: d for d in documents}
        if len(self._by_id) != len(documents):
            raise ValueError("document ids must be unique")

    def __len__(self) -> int:
        return len(self._by_id)

    def search(self, query: str, k: int = 5) -> list[dict[str, str]]:
        """The ``k`` best documents for ``query`` (best first); raises :class:`ToolFailure`
        for a query without words or a ``k`` out of range."""
        if not 1 <= k <= MAX_K:
            raise ToolFailure(f"k must be between 1 and {MAX_K}, got {k}")
        if len(query) > MAX_QUERY_CHARS:
            raise ToolFailure(f"the query has {len(query)} characters; at most {MAX_QUERY_CHARS}")
        match = fts_query(query)
        if not match:
            raise ToolFailure("the query has no words to search for; send some words")
        try:
            rows = self._db.execute(
                f"SELECT doc_id FROM docs WHERE docs MATCH ? ORDER BY {_RANK}, rowid LIMIT ?",
                (match, k),
            ).fetchall()
        except sqlite3.Error as exc:  # not expected (the query shape is fixed): say so
            raise ToolFailure(f"the search failed ({exc}); rephrase the query") from exc
        return [self._hit(self._by_id[row[0]]) for row in rows]

    def open(self, doc_id: str) -> str:
        """The text of document ``doc_id`` (cut to :data:`MAX_OPEN_CHARS`); raises
        :class:`ToolFailure` for an unknown id."""
        doc = self._by_id.get(doc_id)
        if doc is None:
            raise ToolFailure(f"no document {doc_id[:80]!r}; use a doc_id that search returned")
        if len(doc.text) <= MAX_OPEN_CHARS:
            return doc.text
        return doc.text[:MAX_OPEN_CHARS] + f"\n[... {len(doc.text) - MAX_OPEN_CHARS} more]"

    def tools(self) -> ToolBox:
        """The ``search`` and ``open`` tools over this index."""
        return ToolBox(self.tool_list())

    def tool_list(self) -> list[Tool]:
        """The two tools, for a scenario that adds them to a larger :class:`ToolBox`."""
        search_schema: dict[str, Any] = {
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": MAX_QUERY_CHARS,
                          "description": "words to look for (no operators)"},
                "k": {"type": "integer", "minimum": 1, "maximum": MAX_K,
                      "description": f"how many results, 1-{MAX_K} (default 5)"},
            },
            "required": ["query"],
            "additionalProperties": False,
        }  # fmt: skip
        open_schema: dict[str, Any] = {
            "type": "object",
            "properties": {"doc_id": {"type": "string", "maxLength": 64,
                                      "description": "an id from search's results"}},
            "required": ["doc_id"],
            "additionalProperties": False,
        }  # fmt: skip
        return [
            tool(self.search, name="search", description="Search the encyclopedia "
                 "(BM25 over titles and text); returns doc ids, titles and snippets.",
                 parameters=search_schema),
            tool(self.open, name="open", description="Read one document by its doc_id.",
                 parameters=open_schema),
        ]  # fmt: skip

    def close(self) -> None:
        """Free the database (the index is unusable afterwards)."""
        self._db.close()

    @staticmethod
    def _hit(doc: Document) -> dict[str, str]:
        body = doc.text.split("\n", 2)
        snippet = body[1] if len(body) > 1 else doc.text
        return {"doc_id": doc.doc_id, "title": doc.title, "snippet": snippet[:_SNIPPET_CHARS]}
