// vidflow's page: plain JavaScript, no build step. Every URL is relative, so the page works
// at / and under a reverse proxy's sub-path. What tests read is kept on `window.vidflow`. The
// live tiles are live.js (and video.js, a camera's video), loaded before this file.
"use strict";

const $ = (id) => document.getElementById(id);
const vidflow = (window.vidflow = { frames: 0, stills: {}, drawn: {}, shapes: {}, live: {}, counts: null, events: [], reconnects: 0,
  // Live video, per source: pictures presented, those drawn with the boxes of their own frame,
  // the last pictures' times and what was drawn on them, the player's jumps and trims.
  videoFrames: {}, boxesOnVideo: {}, videoLog: {}, video: {}, liveQuery: null });

async function api(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${(await r.text()).trim()}`);
  return r.json();
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  e.append(...children.filter((c) => c !== null && c !== undefined));
  return e;
}

// Seconds as a short duration: 42 s, 3 min 5 s, 1 h 2 min.
const secs = (s) => s < 60 ? `${s.toFixed(s < 10 ? 1 : 0)} s`
  : s < 3600 ? `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`
  : `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;

const when = (ms) => {
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
};

async function sources() {
  try {
    const list = await api("api/sources");
    for (const s of list) {
      const c = camera(s);
      c.state.textContent = s.state;
      c.state.className = "state state-" + s.state;
      decide(c, s);
    }
    fillSelect($("f-source"), list.map((s) => s.name), "all");
    fillSelect($("r-source"), list.map((s) => s.name));
    fillSelect($("h-source"), list.map((s) => s.name));
    return list;
  } catch (e) {
    $("run-state").textContent = "vidflow is not answering";
    return [];
  }
}

function fillSelect(select, names, any) {
  const have = new Set([...select.options].map((o) => o.value));
  if (any !== undefined && !have.has("")) select.append(el("option", { value: "" }, any));
  for (const n of names) if (!have.has(n)) select.append(el("option", { value: n }, n));
}

// ---------------------------------------------------------------- events
let oldest = null;

function eventQuery(beforeId) {
  const q = new URLSearchParams();
  for (const id of ["f-source", "f-kind", "f-label"]) {
    const v = $(id).value.trim();
    if (v) q.set($(id).name, v);
  }
  const since = $("f-since").value;
  if (since) q.set("after", String(Date.now() - Number(since)));
  if (beforeId) q.set("before_id", String(beforeId));
  q.set("limit", "60");
  return "api/events?" + q;
}

// The event of the same source and track with a snapshot nearest in time to `e`, among those
// loaded (none for an event of no track).
function nearestSnapshot(e) {
  if (e.track_id === null || e.track_id === undefined) return null;
  let best = null;
  for (const o of vidflow.events) {
    if (!o.snapshot_url || o.source !== e.source || o.track_id !== e.track_id) continue;
    if (!best || Math.abs(o.start - e.start) < Math.abs(best.start - e.start)) best = o;
  }
  return best;
}

function eventItem(e) {
  const what = e.kind === "crossing" ? `crossed ${e.place} (${e.direction})`
    : e.kind === "enter" ? `entered ${e.place}`
    : e.kind === "leave" ? `left ${e.place}` + (e.dwell_s != null ? ` after ${secs(e.dwell_s)}` : "")
    : e.kind === "loiter" ? `loitering in ${e.place}` + (e.dwell_s != null ? ` for ${secs(e.dwell_s)}` : "")
    : e.kind === "speeding" ? `speeding in ${e.place}` + (e.speed != null ? ` at ${e.speed.toFixed(1)} ${e.speed_unit}` : "")
    : e.kind === "track" ? "seen" : "motion";
  const who = e.track_id !== null ? `${e.label} #${e.track_id}` : e.label;
  // An event without a snapshot of its own (a track seen, motion) shows the one nearest in time
  // of the same track among the events loaded, said so; without one it is a compact row, not an
  // empty card.
  const borrowed = e.snapshot_url ? null : nearestSnapshot(e);
  const src = e.snapshot_url || (borrowed && borrowed.snapshot_url);
  const thumb = src ? el("img", { class: "thumb", src, loading: "lazy", alt: "snapshot" }) : null;
  const apart = borrowed ? (borrowed.start - e.start) / 1000 : 0;
  const at = Math.abs(apart) < 0.05 ? "at the same moment" : `${secs(Math.abs(apart))} ${apart < 0 ? "before" : "after"}`;
  const note = borrowed ? el("div", { class: "muted borrowed" }, `picture: its ${borrowed.kind}, ${at}`) : null;
  const li = el("li", { tabIndex: 0, class: src ? "" : "compact", "data-id": e.id, "data-kind": e.kind, "data-label": e.label, "data-clip": e.clip_url ? "1" : "0", "data-picture": e.snapshot_url ? "own" : borrowed ? "borrowed" : "none" }, thumb,
    el("div", { class: "text" },
      el("span", { class: "kind kind-" + e.kind }, e.kind), " ", el("b", {}, who), " ", what,
      el("div", { class: "muted" }, `${e.source}, ${when(e.start)}`, e.clip_url ? ", clip" : ""), note));
  li.addEventListener("click", () => play(e));
  li.addEventListener("keydown", (k) => k.key === "Enter" && play(e));
  return li;
}

async function loadEvents(more) {
  try {
    const query = eventQuery(more ? oldest : null);
    const list = await api(query);
    const same = (a, b) => a.length === b.length && a.every((e, i) => e.id === b[i].id && e.clip_url === b[i].clip_url && e.snapshot_url === b[i].snapshot_url);
    // A refresh that brings nothing new leaves the list (and its thumbnails) alone.
    if (!more && query === vidflow.query && same(list, vidflow.events)) {
      vidflow.eventsLoaded = (vidflow.eventsLoaded || 0) + 1;
      return;
    }
    vidflow.query = query;
    if (!more) {
      $("timeline").replaceChildren();
      vidflow.events = [];
    }
    vidflow.events.push(...list);
    $("timeline").append(...list.map(eventItem));
    oldest = list.length ? list[list.length - 1].id : oldest;
    $("more").hidden = list.length < 60;
    const labels = new Set(vidflow.events.map((e) => e.label).filter(Boolean));
    fillSelect($("labels"), [...labels]);
    if (!vidflow.events.length) $("timeline").append(el("li", { class: "muted empty" }, "no events match"));
  } catch (e) {
    $("timeline").replaceChildren(el("li", { class: "muted empty" }, String(e.message)));
  }
  vidflow.eventsLoaded = (vidflow.eventsLoaded || 0) + 1;
}

function play(e) {
  const p = $("player");
  p.hidden = false;
  $("player-title").textContent = `${e.label}${e.track_id !== null ? " #" + e.track_id : ""}: ${e.kind}${e.place ? " " + e.place : ""}${e.direction ? " (" + e.direction + ")" : ""}, ${e.source}, ${when(e.start)}`;
  const v = $("player-video");
  if (e.clip_url) {
    v.hidden = false;
    v.src = e.clip_url;
    v.play().catch(() => {});
  } else {
    v.hidden = true;
    v.removeAttribute("src");
    $("player-title").textContent += " (no clip)";
  }
  const img = $("player-snapshot");
  img.hidden = !e.snapshot_url;
  if (e.snapshot_url) img.src = e.snapshot_url;
  p.scrollIntoView({ block: "nearest" });
}

// ---------------------------------------------------------------- counts
let chart = null;

// Every page of a paged route (`{key: [...], next}`), in order.
async function apiPages(path, key) {
  const rows = [];
  for (let next = null; ;) {
    const page = await api(path + (next ? "&cursor=" + encodeURIComponent(next) : ""));
    rows.push(...page[key]);
    if (!(next = page.next)) return rows;
  }
}

async function loadCounts() {
  try {
    let bucket = $("c-bucket").value;
    const counts = (b) => apiPages("api/counts?limit=10000&bucket=" + b, "counts");
    let rows;
    if (bucket) rows = await counts(bucket);
    else {
      // The widest bucket first (the fewest rows): a narrower one only for a short span.
      for (const [b, wider] of [["day", 7 * 86400e3], ["hour", 6 * 3600e3], ["minute", -1]]) {
        rows = await counts((bucket = b));
        if (!rows.length || rows[rows.length - 1].t - rows[0].t > wider) break;
      }
    }
    const keys = [...new Set(rows.map((r) => `${r.source} ${r.place} ${r.name}`))].sort();
    const times = [...new Set(rows.map((r) => r.t))].sort((a, b) => a - b);
    const series = keys.map(() => times.map(() => 0));
    const totals = new Map(keys.map((k) => [k, 0]));
    for (const r of rows) {
      const k = `${r.source} ${r.place} ${r.name}`;
      series[keys.indexOf(k)][times.indexOf(r.t)] += r.n;
      totals.set(k, totals.get(k) + r.n);
    }
    vidflow.counts = { bucket: bucket || "minute", keys, times, series, totals: Object.fromEntries(totals) };
    $("totals").tBodies[0].replaceChildren(...rows.length ? keys.map((k) => {
      const [source, place, name] = k.split(" ");
      return el("tr", { "data-key": k }, el("td", {}, source), el("td", {}, place), el("td", {}, name),
        el("td", { class: "n" }, String(totals.get(k))));
    }) : [el("tr", {}, el("td", { colSpan: 4, class: "muted" }, "no counts yet: a line_counter or zone_count step counts here"))]);
    drawChart(keys, times, series);
  } catch (e) {
    $("chart").textContent = e.message;
  }
  loadZones();
}

// Each zone over the kept time (one bucket a day, summed here): visits and how long they
// lasted, loitering and speeding, and how many were inside.
async function loadZones() {
  try {
    const rows = (await api("api/counts/zones?bucket=day")).zones;
    const by = new Map();
    for (const r of rows) {
      const k = `${r.source}\u0000${r.step}\u0000${r.place}`;
      const z = by.get(k) || { source: r.source, place: r.place, enters: 0, visits: 0, dwell: [], loiter: 0, speeding: 0, object_s: 0, days: 0, max: null };
      z.enters += r.enters; z.visits += r.visits; z.loiter += r.loiter; z.speeding += r.speeding;
      if (r.dwell_s) z.dwell.push([r.visits, r.dwell_s]);
      if (r.occupancy) { z.object_s += r.occupancy.mean; z.days++; z.max = Math.max(z.max ?? 0, r.occupancy.max); }
      by.set(k, z);
    }
    const zones = [...by.values()].map((z) => {
      // Over several days: the mean weighted by visits; p90 and longest the worst day's.
      const n = z.dwell.reduce((a, [v]) => a + v, 0);
      const mean = n ? z.dwell.reduce((a, [v, d]) => a + v * d.mean, 0) / n : null;
      const p90 = z.dwell.length ? Math.max(...z.dwell.map(([, d]) => d.p90)) : null;
      const max = z.dwell.length ? Math.max(...z.dwell.map(([, d]) => d.max)) : null;
      return { ...z, mean, p90, longest: max, inside: z.days ? z.object_s / z.days : null };
    });
    vidflow.zones = zones;
    const cell = (v, f) => el("td", { class: "n" }, v === null ? "" : f ? f(v) : String(v));
    $("zones").tBodies[0].replaceChildren(...zones.length ? zones.map((z) => el("tr", { "data-zone": z.place },
      el("td", {}, z.source), el("td", {}, z.place), cell(z.enters), cell(z.visits), cell(z.mean, secs), cell(z.p90, secs),
      cell(z.longest, secs), cell(z.loiter), cell(z.speeding), cell(z.inside, (v) => v.toFixed(1)), cell(z.max)))
      : [el("tr", {}, el("td", { colSpan: 11, class: "muted" }, "no zones yet: a zone_count step counts visits here"))]);
  } catch (e) {
    $("zones").tBodies[0].replaceChildren(el("tr", {}, el("td", { colSpan: 11, class: "muted" }, e.message)));
  }
}

// ---------------------------------------------------------------- heatmap
async function loadHeatmap() {
  const q = new URLSearchParams({ source: $("h-source").value });
  const label = $("h-label").value.trim();
  if (label) q.set("label", label);
  const since = $("h-since").value;
  if (since) q.set("after", String(Date.now() - Number(since)));
  try {
    const map = await api("api/heatmap?" + q);
    $("h-total").textContent = map.total_s ? `${secs(map.total_s)} of objects seen` : "nobody seen in that time";
    vidflow.heatmap = { query: String(q), total_s: map.total_s };
  } catch (e) {
    $("h-total").textContent = e.message;
  }
  q.set("format", "png");
  $("h-img").src = "api/heatmap?" + q;
}

function drawChart(keys, times, series) {
  const box = $("chart");
  if (!keys.length) {
    if (chart) { chart.destroy(); chart = null; }
    box.textContent = "";
    return;
  }
  const data = [times.map((t) => t / 1000), ...series];
  const width = Math.max(260, box.clientWidth - 12);
  const signature = keys.join("|");
  if (chart && chart.signature === signature) {
    chart.setData(data);
    return;
  }
  if (chart) chart.destroy();
  box.textContent = "";
  const bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.8 / keys.length, 40] }) : undefined;
  chart = new uPlot({
    width, height: 260,
    series: [{}, ...keys.map((k, i) => ({ label: k, stroke: COLORS[i % COLORS.length], fill: COLORS[i % COLORS.length] + "88", paths: bars, points: { show: false } }))],
    axes: [{}, { label: "count" }],
    scales: { x: { time: true } },
  }, data, box);
  chart.signature = signature;
  new ResizeObserver(() => chart && chart.setSize({ width: Math.max(260, box.clientWidth - 12), height: 260 })).observe(box);
}

// ---------------------------------------------------------------- recordings
async function loadRecordings() {
  const source = $("r-source").value;
  try {
    const list = (await api("api/recordings?limit=30&source=" + encodeURIComponent(source))).recordings;
    $("r-list").replaceChildren(...list.map((r) => {
      const li = el("li", {}, el("a", { href: r.url }, `${r.source}: ${when(r.start)}${r.end ? " to " + when(r.end) : " (being written)"}`));
      li.firstChild.addEventListener("click", (ev) => { ev.preventDefault(); playRecording(r, r.start); });
      return li;
    }));
    if (!list.length) $("r-list").replaceChildren(el("li", { class: "muted" }, "no recordings: a video_file or record sink writes them"));
  } catch (e) {
    $("r-list").replaceChildren(el("li", { class: "muted" }, e.message));
  }
}

function playRecording(r, at) {
  const v = $("r-video");
  v.hidden = false;
  v.src = r.url;
  v.onloadedmetadata = () => { v.currentTime = Math.max(0, (at - r.start) / 1000); v.play().catch(() => {}); };
}

$("r-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const at = new Date($("r-time").value).getTime();
  if (!Number.isFinite(at)) return;
  const q = new URLSearchParams({ source: $("r-source").value, after: String(at), before: String(at + 1) });
  try {
    const list = await apiPages("api/recordings?" + q, "recordings");
    if (list.length) playRecording(list[list.length - 1], at);
    else $("r-list").prepend(el("li", { class: "muted" }, "no recording holds " + new Date(at).toLocaleString()));
  } catch (e) {
    $("r-list").prepend(el("li", { class: "muted" }, e.message));
  }
});

// ---------------------------------------------------------------- health
let lastHealth = null;

async function health() {
  try {
    const h = await api("api/health");
    const run = h.run || {};
    const before = lastHealth && lastHealth.run;
    $("h-sources").tBodies[0].replaceChildren(...(run.sources || []).map((s) => {
      const prev = before && before.sources.find((p) => p.name === s.name);
      const fps = prev ? ((s.decoded - prev.decoded) / Math.max(run.uptime_s - before.uptime_s, 0.001)).toFixed(1) : "...";
      return el("tr", { "data-source": s.name }, el("td", {}, s.name), el("td", { class: "source-state state-" + s.state }, s.state),
        el("td", { class: "n" }, fps), el("td", { class: "n" }, String(s.decoded)), el("td", { class: "n" }, String(s.dropped)),
        el("td", { class: "n" }, String(s.reconnects)), recordCell(s.record), videoCell(s.video), errorCell(s.last_error));
    }));
    const kept = (h.storage && h.storage.sinks) || {};
    $("h-sinks").tBodies[0].replaceChildren(...(run.sinks || []).map((s) => el("tr", {},
      el("td", {}, s.name), el("td", { class: "n" }, String(s.written)), el("td", { class: "n" }, String(s.dropped)),
      el("td", { class: "n" }, String(s.queue)),
      el("td", { class: "n" }, kept[s.name] ? `${kept[s.name].kept_files} files, ${mb(kept[s.name].kept_bytes)}` : ""))));
    $("h-disk").textContent = ((h.storage && h.storage.filesystems) || [])
      .map((f) => `${f.folder}: ${mb(f.free_bytes)} free of ${mb(f.size_bytes)}`).join("; ");
    $("h-events").textContent = h.events
      ? `event store ${h.events.path}: ${h.events.events} events, ${h.events.dropped} dropped, ${h.events.errors} errors`
      : "no event store: add [events] path = \"events.db\" to the pipeline";
    $("h-live").textContent = `live stream: ${h.live_dropped} frames dropped, ${h.live.stills_dropped} stills dropped, ${h.live.slow_clients} slow clients closed`;
    $("run-state").textContent = `${run.phase}, ${run.healthy ? "healthy" : "unhealthy"}`;
    lastHealth = h;
  } catch (e) {
    $("run-state").textContent = "vidflow is not answering";
  }
}

// A source's record stream (record_uri) is lost and regained apart from its decoded stream.
function recordCell(r) {
  if (!r) return el("td", { class: "muted record-stream" }, "none");
  const text = `${r.state}, ${r.packets} packets, ${r.reconnects} reconnects`;
  return el("td", { class: "record-stream state-" + r.state, title: r.last_error ? r.last_error.message : "" }, text);
}

// A source's live video: its viewers, the bytes sent them and the times one was skipped
// forward to a keyframe (it fell behind); or why it has none.
function videoCell(v) {
  if (!v) return el("td", { class: "muted video" }, "");
  if (v.available === false) return el("td", { class: "muted video", title: v.why }, "none: " + v.why);
  return el("td", { class: "video" }, `${v.viewers} viewers, ${mb(v.bytes_sent)} sent, ${v.skips} skips`);
}

function errorCell(e) {
  if (!e) return el("td", { class: "muted last-error" }, "none");
  return el("td", { class: "last-error" }, `${when(e.at)}: ${e.message}`);
}

const mb = (b) => (b >= 1e9 ? (b / 1e9).toFixed(1) + " GB" : (b / 1e6).toFixed(1) + " MB");

// ---------------------------------------------------------------- start
for (const id of ["f-source", "f-kind", "f-since"]) $(id).addEventListener("change", () => loadEvents(false));
$("f-label").addEventListener("change", () => loadEvents(false));
$("filters").addEventListener("submit", (ev) => { ev.preventDefault(); loadEvents(false); });
$("more").addEventListener("click", () => loadEvents(true));
$("player-close").addEventListener("click", () => { $("player").hidden = true; $("player-video").pause(); });
$("c-bucket").addEventListener("change", loadCounts);
$("r-source").addEventListener("change", loadRecordings);
$("h-form").addEventListener("submit", (ev) => { ev.preventDefault(); loadHeatmap(); });
for (const id of ["h-source", "h-since"]) $(id).addEventListener("change", loadHeatmap);

(async () => {
  await sources();
  live();
  loadEvents(false);
  loadCounts();
  loadRecordings();
  loadHeatmap();
  health();
  setInterval(sources, 5000);
  setInterval(health, 2000);
  setInterval(loadCounts, 10000);
  // New events show up while nobody pages back.
  setInterval(() => { if ($("more").hidden || !vidflow.events.length) loadEvents(false); }, 5000);
})();
