"""text_html: run text folded past FOLD characters, space-less runs wrapped, always escaped
(the browser half of the check is test_long_text.py)."""

from __future__ import annotations

import html
import re

from parley.arena.view.html import FOLD, WRAP, text_html


def _text(markup: str) -> str:
    """What a browser shows of ``markup`` (tags dropped, entities read)."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def test_long_text_is_folded_wrapped_and_still_escaped() -> None:
    payload = "<script>window.__xss=1</script>"
    move = ("y" * 100 + payload) * 20_000  # 2.6 MB, no space anywhere
    out = text_html(move)
    assert "<script>" not in out  # escaped in every chunk, split or not
    head, _, rest = out.partition("<details class=more>")
    assert _text(head) == move[:FOLD]
    assert rest.startswith(f"<summary>{len(move) - FOLD:,} more characters</summary>")
    assert _text(head) + _text(rest).removeprefix(f"{len(move) - FOLD:,} more characters") == move
    # No run of more than WRAP characters without a break opportunity.
    pieces = re.split(r"<wbr>|<details class=more>|<summary>|</summary>|</details>", out)
    assert max(len(html.unescape(p)) for p in pieces) <= WRAP


def test_short_text_is_left_as_it_was() -> None:
    assert text_html("hello <b> world") == "hello &lt;b&gt; world"
    assert text_html("a" * WRAP) == "a" * WRAP
    assert text_html("a" * (WRAP + 1)) == "a" * WRAP + "<wbr>a"
