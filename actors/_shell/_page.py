"""The page ``subagents serve`` serves: the trees, redrawn from its event stream.

Plain HTML and script, no framework and nothing fetched: each session is an
``li.session`` carrying ``data-id`` and ``data-state`` (what the browser test
reads), its children in a nested list under it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["PAGE"]

PAGE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>subagents: live trees</title>
<style>
  body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em 2em; color: #1d232a; }
  header { display: flex; gap: 1em; align-items: baseline; margin-bottom: 1em; }
  h1 { font-size: 1.3em; margin: 0; }
  #db { font-family: ui-monospace, monospace; color: #555; }
  #status { padding: 0 .5em; border-radius: 3px; background: #eee; }
  #status.live { background: #d7f5dd; }
  ul { list-style: none; margin: 0; padding-left: 1.4em; border-left: 1px dotted #bbb; }
  #trees > ul { border-left: none; padding-left: 0; }
  li.session { margin: .15em 0; }
  .row { display: flex; gap: .8em; align-items: baseline; }
  .name { font-weight: 600; }
  .id, .when { font-family: ui-monospace, monospace; color: #777; font-size: .9em; }
  .state { padding: 0 .45em; border-radius: 3px; font-size: .9em; background: #e8e8e8; }
  .state.running { background: #ffe7a3; }
  .state.waiting { background: #cfe3ff; }
  .state.settled, .state.ended { background: #dff3e2; }
  .state.cancelled { background: #f6d3d3; }
  .inbox.full { color: #a0522d; font-weight: 600; }
  .reports { color: #5b3fa0; }
  .diag { color: #a11; font-family: ui-monospace, monospace; }
</style>
</head>
<body>
<header>
  <h1>subagents</h1><span id="db"></span>
  <span id="status">connecting</span><span id="updated" class="when"></span>
</header>
<main id="trees"><p>no sessions yet</p></main>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token");
const stream = "/events" + (token ? "?token=" + encodeURIComponent(token) : "");

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function session(s) {
  const li = el("li", "session");
  li.dataset.id = s.id;
  li.dataset.state = s.state || "unknown";
  const row = el("div", "row");
  row.append(el("span", "name", s.label || "(no label)"), el("span", "id", s.id));
  if (s.mode) row.append(el("span", "mode", s.mode));
  row.append(el("span", "state " + (s.state || ""), s.state || "?"));
  const inbox = s.inbox || 0;
  row.append(el("span", "inbox" + (inbox ? " full" : ""), inbox + " in the inbox"));
  if (s.reports_waiting) row.append(el("span", "reports", s.reports_waiting + " of them reports"));
  if (s.last_turn) row.append(el("span", "turn", "last turn " + s.last_turn));
  if (s.last_activity) row.append(el("span", "when", s.last_activity));
  li.append(row);
  return li;
}

function tree(t) {
  const top = el("ul");
  const root = session(t);
  top.append(root);
  const lists = new Map([[t.id, root]]);
  for (const d of t.descendants || []) {
    const parent = lists.get(d.parent_id) || root;
    let ul = parent.querySelector(":scope > ul");
    if (!ul) { ul = el("ul"); parent.append(ul); }
    const li = session(d);
    ul.append(li);
    lists.set(d.id, li);
  }
  for (const d of t.diagnostics || []) {
    const what = [d.kind, d.session_id || d.id].filter(Boolean).join(" ");
    top.append(el("li", "diag", what + ": " + (d.detail || "")));
  }
  return top;
}

function render(frame) {
  document.getElementById("db").textContent = frame.db;
  const main = document.getElementById("trees");
  main.replaceChildren();
  if (frame.error) main.append(el("p", "diag", frame.error));
  if (!frame.trees.length) main.append(el("p", null, "no sessions yet"));
  for (const t of frame.trees) main.append(tree(t));
  document.getElementById("updated").textContent = "read " + new Date().toLocaleTimeString();
}

const status = document.getElementById("status");
const events = new EventSource(stream);
function shown(text, cls) { status.textContent = text; status.className = cls; }
events.onmessage = (e) => { render(JSON.parse(e.data)); shown("live", "live"); };
events.onerror = () => shown("reconnecting", "");
</script>
</body>
</html>
"""
