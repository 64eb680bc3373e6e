// parley: rate mode. Shows the pair /api/rate/next gives (what both episodes share once, then
// A and B side by side) and posts A, B or tie with a reason to /api/rate, with the token from
// this page's URL. Everything from the runs is set with textContent.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token") || "";
  const q = `token=${encodeURIComponent(token)}`;
  const rateEl = document.getElementById("rate");
  const statusEl = document.getElementById("status");

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function items(list, cls) {
    const box = el("div", { class: cls });
    for (const item of list) {
      box.appendChild(el("div", { class: item.who === "scenario" ? "obs" : "obs mine" },
                         `${item.who}: ${item.text}`));
    }
    return box;
  }

  async function send(pair, choice, reason, buttons) {
    buttons.forEach((b) => { b.disabled = true; });
    const ref = (side) => ({ run: side.run, episode: side.episode, digest: side.digest });
    // The token goes in the URL: the server checks it before it reads a body.
    const r = await fetch(`/api/rate?${q}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ a: ref(pair.a), b: ref(pair.b), choice: choice, reason: reason }),
    });
    if (!r.ok) {
      buttons.forEach((b) => { b.disabled = false; });
      statusEl.textContent = "not saved: " + (await r.text());
      return;
    }
    load();
  }

  function render(pair, rated) {
    statusEl.textContent = `${rated} rated · ${pair.scenario} · seed ${pair.seed}` +
      (pair.seat ? ` · seat ${pair.seat}` : " · every seat's moves");
    const shared = pair.a.items.slice(0, pair.shared);
    const parts = [];
    if (shared.length) {
      parts.push(el("h3", {}, "both episodes start with"));
      parts.push(items(shared, "shared"));
    }
    const sides = el("div", { class: "pair" });
    for (const [name, side] of [["A", pair.a], ["B", pair.b]]) {
      const col = el("section", { class: "side", id: `side-${name}` });
      // Blind: which run (which model) played a side is not shown, so it cannot sway the
      // choice; the rating records it.
      col.appendChild(el("h3", {}, name));
      col.appendChild(items(side.items.slice(pair.shared), "rest"));
      sides.appendChild(col);
    }
    parts.push(sides);
    const reason = el("input", { id: "reason", autocomplete: "off", maxlength: "2000",
                                 placeholder: "why (optional)" });
    const form = el("div", { class: "choose" });
    const buttons = [["A", "A is better"], ["tie", "tie"], ["B", "B is better"]].map(
      ([choice, label]) => {
        const b = el("button", { type: "button", id: `choose-${choice}` }, label);
        b.addEventListener("click", () => send(pair, choice, reason.value, buttons));
        return b;
      });
    form.append(...buttons, reason);
    parts.push(form);
    rateEl.replaceChildren(...parts);
  }

  async function load() {
    try {
      const r = await fetch(`/api/rate/next?${q}`);
      if (!r.ok) { statusEl.textContent = await r.text(); return; }
      const body = await r.json();
      if (!body.pair) {
        statusEl.textContent = `${body.rated} rated · nothing left to rate`;
        rateEl.replaceChildren();
        return;
      }
      render(body.pair, body.rated);
    } catch (err) {
      statusEl.textContent = "the viewer is not answering (stopped?)";
    }
  }
  load();
})();
