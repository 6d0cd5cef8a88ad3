"""The live console: one HTML page on the metrics listener (``/``) and the JSON it
polls (``/api/overview``), refreshed every second (docs/operations.md, "Console").

Plain HTML, an inline SVG and a small script, no build toolchain and nothing
fetched from elsewhere: the page opens wherever the listener is reachable. The
overview is taken on the event loop's thread like every other read of the router
(router/adapter/snapshots.py), from the same snapshots as metrics and management.
"""

from __future__ import annotations

from typing import Any

from router.adapter.snapshots import snapshot_topics

#: In-flight records listed on the page (the oldest; the rest are counted).
INFLIGHT_SHOWN = 50


def overview(server: Any) -> dict:
    """(On the loop's thread.) The network as this router sees it, its topics and
    its oldest in-flight records."""
    core = server.core
    net = core.net
    peers = server.engine.peers
    routers = sorted(set(net.lsdb.routers()) | set(peers.current) | set(core.lost) | {net.self_id})
    edges = set()
    for r in routers:
        state = net.lsdb.get(r)
        for other, _cost in state.neighbours if state is not None else ():
            edges.add(tuple(sorted((r, other))))
    topics = snapshot_topics(server)
    for t in topics:
        t["routers_with_subscribers"] = sorted(net.interested_routers(t["topic"]))
    inflight = server.engine.management.inflight()
    return {
        "router": net.self_id,
        "epoch": core.epoch,
        "routers": [
            {
                "name": r,
                "self": r == net.self_id,
                "up": r == net.self_id or r in peers.current,
                "reachable": r == net.self_id or r in net.routes.reachable,
            }
            for r in routers
        ],
        "edges": [list(e) for e in sorted(edges)],
        "topics": topics,
        "inflight": inflight[:INFLIGHT_SHOWN],
        "inflight_total": len(inflight),
    }


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>eorouter console</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.7em; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.router circle { stroke: #333; stroke-width: 1.5; }
.router.up circle { fill: #9fd69f; } .router.down circle { fill: #f2a3a3; } .router.self circle { fill: #8fc1ef; }
.edge { stroke: #888; stroke-width: 2; }
#status { color: #777; font-size: 0.85em; }
</style></head>
<body>
<h1>eorouter console: router <span id="router">?</span></h1>
<div id="status">connecting…</div>
<h2>Network (as this router sees it)</h2>
<svg id="graph" width="420" height="300" viewBox="0 0 420 300" role="img" aria-label="router network"></svg>
<h2>Topics</h2>
<table id="topics"><thead><tr><th>topic</th><th>published</th><th>msg/s</th><th>copies</th>
<th>in flight</th><th>oldest (s)</th><th>subscribers at</th></tr></thead><tbody></tbody></table>
<h2>In flight, oldest first (<span id="inflight-total">0</span>)</h2>
<table id="inflight"><thead><tr><th>delivery</th><th>topic</th><th>publisher</th><th>age (s)</th>
<th>waiting on</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
let last = null;
function cell(row, text, numeric) {
  const td = document.createElement("td"); td.textContent = text; if (numeric) td.className = "n"; row.appendChild(td);
}
function drawGraph(data) {
  const svg = document.getElementById("graph"); svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg", n = data.routers.length, at = {};
  data.routers.forEach((r, i) => {
    const a = 2 * Math.PI * i / Math.max(n, 1) - Math.PI / 2;
    at[r.name] = [210 + 110 * Math.cos(a), 150 + 110 * Math.sin(a)];
  });
  for (const [a, b] of data.edges) {
    if (!at[a] || !at[b]) continue;
    const line = document.createElementNS(ns, "line");
    line.setAttribute("class", "edge");
    line.setAttribute("x1", at[a][0]); line.setAttribute("y1", at[a][1]);
    line.setAttribute("x2", at[b][0]); line.setAttribute("y2", at[b][1]);
    svg.appendChild(line);
  }
  for (const r of data.routers) {
    const g = document.createElementNS(ns, "g");
    g.setAttribute("class", "router " + (r.self ? "self" : (r.up ? "up" : "down")));
    g.setAttribute("data-router", r.name);
    const c = document.createElementNS(ns, "circle");
    c.setAttribute("cx", at[r.name][0]); c.setAttribute("cy", at[r.name][1]); c.setAttribute("r", 24);
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", at[r.name][0]); t.setAttribute("y", at[r.name][1] + 5); t.setAttribute("text-anchor", "middle");
    t.textContent = r.name;
    g.appendChild(c); g.appendChild(t); svg.appendChild(g);
  }
}
function drawTables(data, seconds) {
  const before = {};
  if (last) for (const t of last.topics) before[t.topic] = t.published;
  const body = document.querySelector("#topics tbody"); body.replaceChildren();
  for (const t of data.topics) {
    const row = document.createElement("tr"); row.setAttribute("data-topic", t.topic);
    const rate = (t.topic in before && seconds > 0) ? ((t.published - before[t.topic]) / seconds).toFixed(1) : "-";
    cell(row, t.topic); cell(row, t.published, true); cell(row, rate, true); cell(row, t.copies, true);
    cell(row, t.records, true); cell(row, t.oldest_age.toFixed(2), true); cell(row, t.routers_with_subscribers.join(", "));
    body.appendChild(row);
  }
  const fl = document.querySelector("#inflight tbody"); fl.replaceChildren();
  for (const r of data.inflight) {
    const row = document.createElement("tr");
    cell(row, r.identity); cell(row, r.topic); cell(row, r.publisher);
    cell(row, r.age === null ? "-" : r.age.toFixed(2), true); cell(row, r.waiting_on.join(", ") || "-");
    fl.appendChild(row);
  }
  document.getElementById("inflight-total").textContent = data.inflight_total;
}
async function refresh() {
  const started = Date.now();
  try {
    const response = await fetch("/api/overview", {cache: "no-store"});
    if (!response.ok) throw new Error(response.status + " " + response.statusText);
    const data = await response.json();
    document.getElementById("router").textContent = data.router + " (epoch " + data.epoch + ")";
    drawGraph(data);
    drawTables(data, last ? (started - last.at) / 1000 : 0);
    data.at = started; last = data;
    document.getElementById("status").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("status").textContent = "no answer from the router: " + e.message;
  }
  setTimeout(refresh, 1000);
}
refresh();
</script>
</body></html>
"""
