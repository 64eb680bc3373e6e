"""HTML building blocks shared by the pages: escaping, the page shell, links, numbers.

Every piece of text that came from a run (agent messages, observations, failure reasons,
metric and seat names, even run ids) goes through :func:`esc` before it reaches a page;
attribute values are quoted and escaped the same way. The shell sets a Content Security
Policy that allows no inline script at all, so markup that slipped through would still not
run.
"""

from __future__ import annotations

import hashlib
import html
import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["CSP", "Links", "esc", "num", "page", "pm", "text_html"]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'"
)
"""Only the package's own scripts and styles run; no inline script, no plugin."""


def esc(value: object) -> str:
    """Text as HTML (quotes included, so it is safe in attribute values too). A lone
    surrogate (``json.loads`` reads ``"\\ud800"``) becomes ``?``: unencodable, it had made every
    page that showed it, and the whole static export, fail."""
    text = str(value)
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")
    return html.escape(text, quote=True)


FOLD = 4000
"""Characters of a text shown before the rest is folded."""
WRAP = 80
"""Longest run of characters without a break opportunity."""

_RUN = re.compile(rf"\S{{{WRAP + 1},}}")


def _wrapped(text: str) -> str:
    """``text`` as HTML, with ``<wbr>`` every :data:`WRAP` characters of a space-less run."""
    out, at = [], 0
    for run in _RUN.finditer(text):
        out.append(esc(text[at : run.start()]))
        word = run.group()
        out.append("<wbr>".join(esc(word[i : i + WRAP]) for i in range(0, len(word), WRAP)))
        at = run.end()
    out.append(esc(text[at:]))
    return "".join(out)


def text_html(text: str) -> str:
    """Text from the run as HTML: escaped, wrapped, and folded past :data:`FOLD` characters."""
    if len(text) <= FOLD:
        return _wrapped(text)
    rest = len(text) - FOLD
    return (
        f"{_wrapped(text[:FOLD])}<details class=more><summary>{rest:,} more characters"
        f"</summary>{_wrapped(text[FOLD:])}</details>"
    )


def num(value: object, digits: int = 3) -> str:
    """A number for a table cell ("-" when missing or not finite)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    if not math.isfinite(value):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def pm(mean: Any, ci: Any, digits: int = 3) -> str:
    """``mean ± ci`` (just the mean when the interval is unknown; "-" without a mean: a
    value read from a file may be anything)."""
    if not _real(mean):
        return "-"
    if not _real(ci):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {ci:.{digits}f}"


def _real(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Links:
    """URLs of the pages: served (``/run/ID``) or exported as files (``run-ID.html``).
    Ids are made of ``[A-Za-z0-9_.-]``; they are quoted anyway."""

    static: bool = False

    def _q(self, part: str) -> str:
        return quote(part, safe="")

    def index(self) -> str:
        return "index.html" if self.static else "/"

    def asset(self, name: str) -> str:
        return f"static/{name}" if self.static else f"/static/{name}"

    def _file(self, kind: str, *ids: str) -> str:
        """A static page's file name: the ids quoted and joined by ``=`` (which quoting
        always escapes, so two pages never share a name: ``-`` had let a run called
        ``victim-t00000`` overwrite another run's episode page), hashed past 180 chars."""
        name = kind + "-" + "=".join(self._q(i) for i in ids)
        if len(name) > 180:
            name = f"{name[:120]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
        return name + ".html"

    def run(self, rid: str) -> str:
        return self._file("run", rid) if self.static else f"/run/{self._q(rid)}"

    def episodes(self, rid: str, **query: str) -> str:
        if self.static:
            return self._file("episodes", rid)
        q = {k: v for k, v in query.items() if v}
        return f"/run/{self._q(rid)}/episodes" + (f"?{urlencode(q)}" if q else "")

    def episode(self, rid: str, ep: str) -> str:
        if self.static:
            return self._file("episode", rid, ep)
        return f"/run/{self._q(rid)}/episode/{self._q(ep)}"

    def compare(self, a: str, b: str) -> str:
        if self.static:
            return self._file("compare", a, b)
        return "/compare?" + urlencode({"a": a, "b": b})

    def train(self, tid: str) -> str:
        return self._file("train", tid) if self.static else f"/train/{self._q(tid)}"

    def league(self, lid: str) -> str:
        return self._file("league", lid) if self.static else f"/league/{self._q(lid)}"

    def eval(self, eid: str) -> str:
        return self._file("eval", eid) if self.static else f"/eval/{self._q(eid)}"


def page(title: str, body: str, links: Links, *, scripts: tuple[str, ...] = ()) -> str:
    """A whole HTML document: ``title`` is escaped here, ``body`` must already be HTML."""
    tags = "".join(f'<script src="{esc(links.asset(s))}" defer></script>' for s in scripts)
    meta = f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        f"{meta}<meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>{esc(title)} · parley</title>"
        f'<link rel=stylesheet href="{esc(links.asset("view.css"))}">{tags}</head>'
        f'<body><header><a class=brand href="{esc(links.index())}">parley view</a>'
        f"<span class=title>{esc(title)}</span></header><main>{body}</main></body></html>\n"
    )
