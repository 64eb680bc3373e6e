// parley: the human seat page. Long-polls /api/state and posts moves to /api/act, with the
// token from this page's URL. Everything from the scenario is set with textContent.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token") || "";
  const gamesEl = document.getElementById("games");
  const statusEl = document.getElementById("status");
  const drafts = new Map();
  let version = -1;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  async function send(game, text, input) {
    input.disabled = true;
    // The token goes in the URL: the server checks it before it reads a body.
    const r = await fetch(`/api/act?token=${encodeURIComponent(token)}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ game: game.id, text: text }),
    });
    if (!r.ok) {
      input.disabled = false;
      statusEl.textContent = "move not sent: " + (await r.text());
      return;
    }
    drafts.delete(game.id);
  }

  function renderGame(game) {
    const box = el("section", { class: "game", "data-game": game.id });
    box.appendChild(el("h2", {}, `${game.seat} · ${game.scenario}` + (game.done ? " · over" : "")));
    if (game.rules) box.appendChild(el("div", { id: "rules" }, game.rules));
    const history = el("div", { id: "history" });
    for (const item of game.history) {
      history.appendChild(el("div", { class: item.from === "you" ? "obs mine" : "obs" },
                             item.from === "you" ? "you: " + (item.text || "(empty message)") : item.text));
    }
    box.appendChild(history);
    if (game.done) {
      box.appendChild(el("p", { class: "over" },
        "The episode is over; it is recorded with the run (parley view OUT shows it)."));
      return box;
    }
    if (game.invalid) box.appendChild(el("p", { id: "error" }, "Invalid move: " + game.invalid));
    if (game.hint) box.appendChild(el("p", { id: "hint" }, game.hint));
    if (!game.waiting) {
      box.appendChild(el("p", { class: "wait" }, "waiting for the other seats…"));
      return box;
    }
    const form = el("form", { class: "move" });
    const input = el("input", { class: "action", id: "action", autocomplete: "off",
                                placeholder: "your move, then Enter" });
    input.value = drafts.get(game.id) || "";
    input.addEventListener("input", () => drafts.set(game.id, input.value));
    form.appendChild(input);
    form.appendChild(el("button", { type: "submit" }, "send"));
    form.addEventListener("submit", (e) => { e.preventDefault(); send(game, input.value, input); });
    box.appendChild(form);
    if (game.constraint && game.constraint.type === "choice") {
      const choices = el("div", { id: "choices" });
      for (const c of game.constraint.choices || []) {
        const b = el("button", { type: "button", class: "choice" }, c);
        b.addEventListener("click", () => send(game, c, input));
        choices.appendChild(b);
      }
      box.appendChild(choices);
    }
    setTimeout(() => input.focus(), 0);
    return box;
  }

  function render(state) {
    const live = state.games.filter((g) => !g.done);
    const waiting = live.filter((g) => g.waiting).length;
    statusEl.textContent = live.length
      ? `${live.length} game(s) in play, ${waiting} waiting for your move`
      : "no game in play (yet): the run starts one when a human seat has to move";
    statusEl.setAttribute("data-version", String(state.version));
    gamesEl.replaceChildren(...state.games.map(renderGame));
  }

  async function loop() {
    for (;;) {
      try {
        const r = await fetch(`/api/state?token=${encodeURIComponent(token)}&since=${version}`);
        if (r.status === 403) { statusEl.textContent = await r.text(); return; }
        const state = await r.json();
        if (state.version !== version) { version = state.version; render(state); }
      } catch (err) {
        statusEl.textContent = "the run is not answering (over?)";
        await new Promise((ok) => setTimeout(ok, 2000));
      }
    }
  }
  loop();
})();
