"""One episode as a timeline: a column per seat, a row per step.

In each seat's column: what the seat was shown (its private observation, folded), what it
answered (a chat bubble; a JSON tool call is shown as a tool call), the scenario's verdict
when the move was invalid, the step's reward with its components, and the seat's
structured ``view`` (its private knowledge) — so the seats' private views sit side by side.
The episode's outcome (status, failure reason, metrics, returns) heads the page.

What a transcript holds is shown whatever its size: every text from the run goes through
:func:`~parley.arena.view.html.text_html`, which folds long text (the rest behind a closed
``details``, which the browser does not lay out until it is opened) and gives long runs of
characters without a space break opportunities (``<wbr>``). One space-less 120k-character
move had taken Chromium 28 s to lay out, a 1 MB one never finished: a word that long is
measured again at every place it could break.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from parley.arena.view.data import Source
from parley.arena.view.html import Links, esc, num, page, text_html

__all__ = ["episode_page"]


def _action_html(text: str) -> str:
    """The seat's move: a chat bubble; a JSON move with ``tool_calls`` shows each call and
    its ``message`` (what the other seats hear) apart."""
    stripped = text.strip()
    if stripped.startswith("{") and "tool" in stripped:
        try:
            move = json.loads(stripped)
        except (ValueError, RecursionError):  # (a move nested too deeply: shown as text)
            move = None
        if isinstance(move, dict):
            return _tool_move_html(move)
    if not text:
        return "<div class='msg empty'>(empty)</div>"
    return f"<div class=msg>{text_html(text)}</div>"


def _tool_move_html(move: dict[str, Any]) -> str:
    calls = move.get("tool_calls")
    out = []
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, dict):
                name = esc(call.get("name", "?"))
                args = text_html(json.dumps(call.get("arguments", {}), ensure_ascii=False))
                out.append(
                    f"<div class='msg tool'><span class=tag>tool call</span> {name}{args}</div>"
                )
            else:
                out.append(f"<div class='msg tool'>{text_html(str(call))}</div>")
    rest = {k: v for k, v in move.items() if k not in ("tool_calls", "message")}
    if rest:
        pretty = text_html(json.dumps(rest, indent=1, ensure_ascii=False))
        out.append(f"<div class='msg tool'><pre>{pretty}</pre></div>")
    if "message" in move:
        out.append(f"<div class=msg>{text_html(str(move['message']))}</div>")
    return "".join(out)


def _tool_results_html(view: Any) -> str:
    results = view.get("tool_results") if isinstance(view, Mapping) else None
    if not isinstance(results, list):
        return ""
    out = []
    for result in results:
        if not isinstance(result, Mapping):
            continue
        label = "tool error" if result.get("error") else "tool result"
        body = result.get("error") or result.get("content", "")
        out.append(
            f"<div class='msg result'><span class=tag>{label}</span> "
            f"{esc(result.get('name', ''))}: {text_html(str(body))}</div>"
        )
    return "".join(out)


def _components(info: Mapping[str, Any]) -> str:
    comps = info.get("components") or {}
    if not isinstance(comps, Mapping) or not comps:
        return ""
    return " (" + ", ".join(f"{esc(k)} {esc(num(v))}" for k, v in comps.items()) + ")"


def _map(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else empty (a transcript from elsewhere may put a list
    where a step has a map: one such step had failed its page and the whole export)."""
    return value if isinstance(value, Mapping) else {}


def _cell(seat: str, step: Mapping[str, Any]) -> str:
    obs = _map(step.get("observations")).get(seat)
    actions = _map(step.get("actions"))
    info = _map(_map(step.get("infos")).get(seat))
    reward = _map(step.get("rewards")).get(seat, 0.0)
    out = []
    if obs is not None:
        out.append(
            f"<details class=obs><summary>observation</summary><pre>{text_html(str(obs))}</pre>"
            "</details>"
        )
    if seat in actions:
        out.append(_action_html(str(actions[seat])))
        out.append(_tool_results_html(info.get("view")))
    if info.get("invalid"):
        out.append(f"<div class=invalid>invalid: {text_html(str(info['invalid']))}</div>")
    if reward or info.get("components"):
        out.append(f"<div class=reward>reward {esc(num(reward))}{_components(info)}</div>")
    if isinstance(info.get("view"), Mapping) and info.get("view"):
        view = json.dumps(info["view"], indent=1, ensure_ascii=False)
        out.append(
            f"<details class=view><summary>private view</summary><pre>{text_html(view)}</pre>"
            "</details>"
        )
    if _map(step.get("terminations")).get(seat) or _map(step.get("truncations")).get(seat):
        out.append("<div class=ended>done</div>")
    return "".join(out)


def episode_page(src: Source, ep: Mapping[str, Any], links: Links) -> str:
    eid = str(ep.get("episode", ""))
    agents = _map(ep.get("agents"))
    raw_steps = ep.get("steps")
    steps = (
        [st for st in raw_steps if isinstance(st, Mapping)] if isinstance(raw_steps, list) else []
    )
    seats = list(agents) or sorted({str(s) for st in steps for s in _map(st.get("actions"))})
    status = str(ep.get("status", ""))
    metrics = _map(ep.get("metrics"))
    returns = _map(ep.get("returns"))
    outcome = [
        f"<div id=outcome class='outcome {esc(status)}'><b>{esc(status)}</b>",
        f" · scenario {esc(ep.get('scenario', ''))} · seed {esc(ep.get('seed', ''))}",
        f" · task {esc(ep.get('task', ''))} trial {esc(ep.get('trial', ''))}",
    ]
    if ep.get("failed"):
        outcome.append(f"<div class=failed-reason>failed: {text_html(str(ep['failed']))}</div>")
    if metrics:
        outcome.append(
            "<div>metrics: "
            + ", ".join(f"{esc(k)} {esc(num(v))}" for k, v in metrics.items())
            + "</div>"
        )
    if returns:
        outcome.append(
            "<div>returns: "
            + ", ".join(f"{esc(k)} {esc(num(v))}" for k, v in returns.items())
            + "</div>"
        )
    outcome.append("</div>")
    head = "".join(f"<th>{esc(s)}<br><small>{esc(agents.get(s, ''))}</small></th>" for s in seats)
    rows = []
    for step in steps:
        cells = "".join(f"<td>{_cell(s, step)}</td>" for s in seats)
        rows.append(f"<tr><td class=turn>{esc(step.get('turn', ''))}</td>{cells}</tr>")
    body = (
        f'<p><a href="{esc(links.run(src.id))}">← run {esc(src.id)}</a> · '
        f'<a href="{esc(links.episodes(src.id))}">episodes</a></p>'
        + "".join(outcome)
        + f"<table id=timeline class=timeline><tr><th>step</th>{head}</tr>{''.join(rows)}</table>"
    )
    return page(f"episode {eid}", body, links)
