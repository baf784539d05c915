//! `/simple`: a one-file status page, no script library (the full page is `/`, `pages.rs`): every source's live preview (when it has a preview sink)
//! and its counters, refreshed every second from `/stats.json`. The pictures come as stills over
//! one live stream (`/api/live?stills=1&frames=0`: no boxes, which this page does not draw), never one MJPEG stream per camera: a browser gives a
//! host six connections, and five cameras would leave the counters none.

pub(super) const HTML: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>vidflow</title>
<style>
  body { margin: 0; font: 14px system-ui, sans-serif; background: #f4f4f4; color: #222; }
  #sources { display: flex; flex-wrap: wrap; gap: 8px; padding: 8px; }
  .source { background: #fff; border: 1px solid #ccc; padding: 0; width: 320px; }
  .source img, .source .none { display: block; width: 320px; height: 240px; background: #000; object-fit: contain; }
  .source .none { color: #ccc; display: flex; align-items: center; justify-content: center; text-align: center; }
  .source h2 { font-size: 15px; margin: 6px 8px 2px; }
  table { border-collapse: collapse; margin: 0 8px 8px; }
  td { padding: 1px 8px 1px 0; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
  #run { padding: 0 8px 8px; }
  .bad { color: #b00; }
</style>
</head>
<body>
<div id="sources"></div>
<div id="run">loading...</div>
<div id="live"></div>
<script>
"use strict";
const cards = new Map();
let previous = null;

function card(source) {
  let c = cards.get(source.name);
  if (c) return c;
  const section = document.createElement("section");
  section.className = "source";
  section.id = "source-" + source.name;
  let view;
  if (source.preview) {
    view = document.createElement("img");
    view.id = "preview-" + source.name;
    view.alt = "preview of " + source.name;
    c = { view };
    watch();
  } else {
    view = document.createElement("div");
    view.className = "none";
    view.textContent = "no preview sink for this source";
  }
  const title = document.createElement("h2");
  title.textContent = source.name;
  const table = document.createElement("table");
  section.append(view, title, table);
  document.getElementById("sources").append(section);
  c = Object.assign(c || {}, { table });
  cards.set(source.name, c);
  return c;
}

// Every source's picture over one connection: the live stream's stills only (`frames=0`: this
// page draws no boxes), each in parts of base64 joined, decoded by the browser off the main
// thread (a data: URL's fetch) and shown through a blob URL, the previous one released. After
// an error or a refusal (503: as many live clients as the endpoint takes) it opens a new stream
// after 1 s, doubling up to 30 s, each wait drawn between half and all of it.
let live = null;
let failures = 0;
const parts = new Map();
function watch() {
  if (live) return;
  live = new EventSource("/api/live?stills=1&frames=0");
  live.onopen = () => {
    failures = 0;
    document.getElementById("live").textContent = "";
  };
  live.onerror = () => {
    live.close();
    live = null;
    parts.clear();
    const wait = Math.min(30000, 1000 * 2 ** failures) * (0.5 + Math.random() / 2);
    failures++;
    document.getElementById("live").textContent = `pictures: reconnecting in ${Math.ceil(wait / 1000)} s`;
    setTimeout(watch, wait);
  };
  live.addEventListener("still", async (m) => {
    const s = JSON.parse(m.data);
    const joined = (parts.get(s.source) || "") + s.jpeg;
    if (s.more) {
      parts.set(s.source, joined);
      return;
    }
    parts.delete(s.source);
    const c = cards.get(s.source);
    if (!c || !c.view) return;
    const n = (c.seq = (c.seq || 0) + 1);
    const blob = await (await fetch("data:image/jpeg;base64," + joined)).blob();
    if (n !== c.seq) return;
    const old = c.url;
    c.url = URL.createObjectURL(blob);
    c.view.src = c.url;
    if (old) URL.revokeObjectURL(old);
  });
}

function row(table, key, value) {
  const tr = document.createElement("tr");
  const k = document.createElement("td");
  const v = document.createElement("td");
  k.textContent = key;
  v.textContent = value;
  v.className = "n";
  v.dataset.counter = key;
  tr.append(k, v);
  table.append(tr);
}

async function refresh() {
  try {
    const stats = await (await fetch("/stats.json", { cache: "no-store" })).json();
    for (const s of stats.sources) {
      const c = card(s);
      c.table.replaceChildren();
      const before = previous && previous.sources.find((p) => p.name === s.name);
      // Measured between two refreshes: "..." until the second one.
      const fps = before ? ((s.decoded - before.decoded) / Math.max(stats.uptime_s - previous.uptime_s, 0.001)).toFixed(1) : "...";
      row(c.table, "state", s.state);
      row(c.table, "decoded", s.decoded);
      row(c.table, "frames/s", fps);
      row(c.table, "dropped", s.dropped);
      row(c.table, "throttled", s.throttled);
      row(c.table, "reconnects", s.reconnects);
      row(c.table, "size changes", s.size_changes);
    }
    const sinks = stats.sinks.map((k) => `${k.name}: ${k.written} written, ${k.skipped} skipped, ${k.dropped} dropped, queue ${k.queue}`);
    const run = document.getElementById("run");
    run.className = stats.healthy ? "" : "bad";
    run.textContent = `${stats.phase}, ${stats.healthy ? "healthy" : "unhealthy"}; delivered ${stats.delivered} (${stats.failed} failed); ${sinks.join("; ")}`;
    previous = stats;
  } catch (e) {
    document.getElementById("run").textContent = "vidflow is not answering: " + e;
  }
}

refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
"#;
