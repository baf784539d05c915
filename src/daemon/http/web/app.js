// vidflow's page: plain JavaScript, no build step. Every URL is relative, so the page works
// at / and under a reverse proxy's sub-path. What tests read is kept on `window.vidflow`.
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

// ---------------------------------------------------------------- live
const cams = new Map();
const COLORS = ["#22d3ee", "#facc15", "#f472b6", "#4ade80", "#fb923c", "#a78bfa", "#f87171"];

function camera(source) {
  let c = cams.get(source.name);
  if (c) return c;
  const canvas = el("canvas", { class: "boxes", "data-source": source.name });
  const view = el("div", { class: "view" });
  // The camera's own video where it has H.264 and the browser plays it (video.js), over a
  // WebSocket each (not counted among the six connections a browser opens per host); else
  // its stills, over the one live stream (`still` events below), never a connection per camera.
  const video = document.createElement("video");
  for (const a of ["muted", "playsinline", "autoplay"]) video.setAttribute(a, "");
  video.setAttribute("data-source", source.name);
  video.muted = true;
  video.hidden = true;
  const img = source.preview ? el("img", { alt: "live picture of " + source.name }) : null;
  const none = el("div", { class: "none" }, "no preview sink for this source: boxes only");
  const why = el("span", { class: "why", hidden: true });
  view.append(video, img || none, canvas, why);
  const state = el("span", { class: "state" });
  const counts = el("span", { class: "counts muted" });
  const card = el("article", { class: "cam", id: "cam-" + source.name }, view,
    el("div", { class: "meta" }, el("b", {}, source.name), state, counts));
  $("grid").append(card);
  c = { name: source.name, card, view, canvas, video, img, none, why, url: null, state, counts, frame: null, shapes: {}, pending: false,
    mode: "stills", player: null, ring: new Map(), shown: null, onScreen: null, held: false, visible: true };
  cams.set(source.name, c);
  if (!noVideo) c.player = player(c, !source.file);
  new ResizeObserver(() => draw(c)).observe(view);
  // Video only while the tile is on screen (a phone shows a few of 16 cameras at once).
  new IntersectionObserver((seen) => { c.visible = seen[seen.length - 1].isIntersecting; playOrNot(c); }).observe(card);
  return c;
}

// Where the picture lies in the tile (object-fit: contain) and the scale from the frame's
// pixels to it: from the video's own size when it plays (the frame may be of another size).
function placement(c, f, w, h) {
  const v = c.video;
  const [pw, ph] = c.mode === "video" && v.videoWidth ? [v.videoWidth, v.videoHeight] : [f.width, f.height];
  const k = Math.min(w / pw, h / ph);
  return { ox: (w - pw * k) / 2, oy: (h - ph * k) / 2, sx: (pw * k) / f.width, sy: (ph * k) / f.height };
}

function draw(c) {
  c.pending = false;
  const cv = c.canvas;
  const w = cv.clientWidth, h = cv.clientHeight, dpr = window.devicePixelRatio || 1;
  if (cv.width !== Math.round(w * dpr) || cv.height !== Math.round(h * dpr)) {
    cv.width = Math.round(w * dpr);
    cv.height = Math.round(h * dpr);
  }
  const g = cv.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  // Over video: the boxes of the picture on screen (none when its frame is not known); over
  // stills: the newest frame's.
  const f = c.mode === "video" ? c.onScreen : c.frame;
  const sized = f || c.frame;
  if (!sized || !sized.width) return [];
  const { ox, oy, sx, sy } = placement(c, sized, w, h);
  g.lineWidth = 2;
  g.font = "12px system-ui, sans-serif";
  drawShapes(c, g, sx, sy, ox, oy);
  if (!f) return [];
  const drawn = [];
  for (const b of f.boxes) {
    const [x, y, bw, bh] = [b.box[0] * sx, b.box[1] * sy, b.box[2] * sx, b.box[3] * sy];
    const color = COLORS[(b.id ?? 0) % COLORS.length];
    g.strokeStyle = color;
    g.setLineDash(b.predicted ? [4, 3] : []);
    g.strokeRect(ox + x, oy + y, bw, bh);
    const speed = b.speed !== null && b.speed !== undefined ? ` ${b.speed.toFixed(b.speed_unit === "km/h" ? 1 : 0)} ${b.speed_unit}` : "";
    const text = (b.id !== undefined ? `${b.label} #${b.id}` : `${b.label} ${(b.score * 100).toFixed(0)}%`) + speed;
    const tw = g.measureText(text).width + 6;
    g.fillStyle = color;
    g.fillRect(ox + x, oy + y - 15, tw, 15);
    g.fillStyle = "#000";
    g.fillText(text, ox + x + 3, oy + y - 3);
    drawn.push([b.id ?? null, ...b.box.map((v) => Math.round(v))]);
  }
  vidflow.drawn[f.source] = { seq: f.seq, boxes: drawn };
  cv.dataset.seq = f.seq;
  cv.dataset.boxes = JSON.stringify(drawn);
  return drawn;
}

// The lines and zones of the counting steps, under the boxes: a zone filled faintly, a line
// with its name at its first point. Kept per step from the last frame that step ran on.
function drawShapes(c, g, sx, sy, ox, oy) {
  const drawn = [];
  g.save();
  g.setLineDash([]);
  for (const s of Object.values(c.shapes).flat()) {
    const pts = s.points.map(([x, y]) => [ox + x * sx, oy + y * sy]);
    g.beginPath();
    pts.forEach(([x, y], i) => (i ? g.lineTo(x, y) : g.moveTo(x, y)));
    if (s.kind === "zone") {
      g.closePath();
      g.fillStyle = "rgba(96, 165, 250, 0.18)";
      g.fill();
    }
    g.strokeStyle = s.kind === "zone" ? "#60a5fa" : "#ef4444";
    g.lineWidth = 3;
    g.stroke();
    g.fillStyle = g.strokeStyle;
    g.fillText(s.name, pts[0][0] + 4, pts[0][1] - 4);
    drawn.push({ kind: s.kind, name: s.name, points: s.points });
  }
  g.restore();
  vidflow.shapes[c.name] = drawn;
  c.canvas.dataset.shapes = JSON.stringify(drawn);
}

// A camera's still comes in parts (`more`: another follows), its JPEG in base64: the parts are
// joined, the browser decodes the base64 off the main thread (a data: URL's fetch), and the
// picture is shown through a blob URL, the previous one released.
const stillParts = new Map();
async function still(m) {
  const s = JSON.parse(m.data);
  const joined = (stillParts.get(s.source) || "") + s.jpeg;
  if (s.more) {
    stillParts.set(s.source, joined);
    return;
  }
  stillParts.delete(s.source);
  const c = cams.get(s.source);
  if (!c || !c.img) return;
  const n = (c.stillSeq = (c.stillSeq || 0) + 1);
  const blob = await (await fetch("data:image/jpeg;base64," + joined)).blob();
  if (n !== c.stillSeq) return; // a newer still was decoded first
  const old = c.url;
  c.url = URL.createObjectURL(blob);
  c.img.src = c.url;
  if (old) URL.revokeObjectURL(old);
  vidflow.stills[s.source] = (vidflow.stills[s.source] || 0) + 1;
}

// The live stream's back-off after an error or a refusal (a 503 when the endpoint has as many
// live clients as it takes): 1 s, doubling up to 30 s, each wait drawn between half and all of
// it, so that pages refused together do not come back together. An EventSource gives up for
// good on an answer other than 200, so the page opens a new one itself.
const LIVE_RETRY_FIRST_MS = 1000;
const LIVE_RETRY_MAX_MS = 30000;
let liveFailures = 0;

function frame(m) {
  const f = JSON.parse(m.data);
  vidflow.frames++;
  vidflow.live[f.source] = f.counts;
  const c = cams.get(f.source);
  if (!c) return;
  c.frame = f;
  for (const step of new Set((f.shapes || []).map((s) => s.step))) c.shapes[step] = f.shapes.filter((s) => s.step === step);
  c.counts.textContent = Object.entries(f.counts || {})
    .map(([step, n]) => step + ": " + Object.entries(n).map(([k, v]) => `${k} ${v}`).join(" "))
    .join("; ");
  if (c.mode === "video") {
    videoFrame(c, f);
    return;
  }
  // Drawn at the next paint; a hidden page (no paints) keeps its boxes current anyway.
  if (document.hidden) draw(c);
  else if (!c.pending) {
    c.pending = true;
    requestAnimationFrame(() => draw(c));
  }
}

let liveStream = null, liveRetry = null;

// What the live stream is asked for: the stills of the tiles that show stills only (none when
// every tile plays video), so that no camera shown as video costs a JPEG encoder.
function liveQuery() {
  const previews = [...cams.values()].filter((c) => c.img);
  const stills = previews.filter((c) => c.mode !== "video").map((c) => c.name).sort();
  if (!stills.length) return "api/live";
  return stills.length === previews.length ? "api/live?stills=1" : "api/live?stills_of=" + stills.join(",");
}

// Opens the live stream again when the tiles that need stills changed.
let askAgain = null;
function liveAskAgain() {
  clearTimeout(askAgain);
  askAgain = setTimeout(() => {
    if (liveStream && liveQuery() !== vidflow.liveQuery) {
      liveStream.close();
      stillParts.clear();
      live();
    }
  }, 300);
}

function live() {
  // One long-lived connection per page: the boxes of every frame and the stills it needs.
  clearTimeout(liveRetry);
  const stream = (liveStream = new EventSource((vidflow.liveQuery = liveQuery())));
  stream.addEventListener("still", still);
  stream.addEventListener("frame", frame);
  stream.onopen = () => {
    liveFailures = 0;
    $("live-state").textContent = "live";
    $("live-state").className = "";
  };
  stream.onerror = () => {
    stream.close();
    if (liveStream !== stream) return;
    stillParts.clear();
    const cap = Math.min(LIVE_RETRY_MAX_MS, LIVE_RETRY_FIRST_MS * 2 ** liveFailures);
    const wait = cap * (0.5 + Math.random() / 2);
    liveFailures++;
    $("live-state").textContent = `live stream lost: reconnecting in ${Math.ceil(wait / 1000)} s`;
    $("live-state").className = "bad";
    liveRetry = setTimeout(() => {
      vidflow.reconnects++;
      live();
    }, wait);
  };
}

// ---------------------------------------------------------------- live video
// A tile plays video (video.js) unless the source has none (not H.264), this browser cannot
// play it, or it failed GIVE_UP times in a row; then it shows stills, and says why.
const noVideo = videoUnsupported();
// Live frames kept per source to find a picture's boxes: some seconds at 25 fps.
const FRAMES_KEPT = 128;

// The tile's mode from what /api/sources says of its source.
function decide(c, s) {
  const v = s.video || {};
  c.available = v.available !== false;
  if (noVideo) setMode(c, "stills", noVideo);
  else if (c.unsupported) setMode(c, "stills", c.unsupported);
  else if (!c.available) setMode(c, "stills", "no live video: " + v.why);
  else if (c.mode === "stills" && !c.failed) setMode(c, "video");
  playOrNot(c);
}

function setMode(c, mode, why) {
  why = why || "";
  if (c.mode === mode && c.card.dataset.why === why) return;
  c.mode = mode;
  c.card.dataset.mode = mode;
  c.card.dataset.why = why;
  c.video.hidden = mode !== "video";
  if (c.img) c.img.hidden = mode === "video";
  c.none.hidden = mode === "video";
  c.onScreen = null;
  say(c, why);
  playOrNot(c);
  liveAskAgain();
  draw(c);
}

function say(c, text) {
  c.why.textContent = c.why.title = text;
  c.why.hidden = !text;
}

// Plays while the tile wants video and is on screen in a page on screen; else lets it go after
// a while (a tile scrolled past, a tab in the background).
function playOrNot(c) {
  if (!c.player) return;
  const want = c.available && !c.unsupported && (c.mode === "video" || c.failed) && c.visible && !document.hidden;
  clearTimeout(c.letGo);
  if (want) c.player.start();
  else if (c.player.running) {
    c.letGo = setTimeout(() => c.player.stop(), c.mode === "video" ? 10000 : 0);
  }
}

function player(c, paced) {
  const p = new LiveVideo(c.name, c.video, {
    frame: (mediaTime) => presented(c, mediaTime),
    playing: () => {
      c.failed = false;
      say(c, "");
      if (c.mode !== "video") setMode(c, "video");
    },
    failing: (why, wait, failures) => {
      const again = `trying again in ${Math.ceil(wait / 1000)} s`;
      if (failures >= LIVE_VIDEO.GIVE_UP) {
        c.failed = true;
        setMode(c, "stills", `live video failed (${why}): stills; ${again}`);
      } else say(c, `live video lost (${why}): ${again}`);
    },
    unsupported: (why) => {
      c.unsupported = why;
      setMode(c, "stills", why);
    },
  }, paced);
  vidflow.video[c.name] = p.stats;
  return p;
}

// A live frame of a tile that plays video: kept until its picture shows.
function videoFrame(c, f) {
  const key = Math.round(f.media_time * c.player.timescale);
  c.ring.set(key, f);
  f.key = key;
  if (c.ring.size > FRAMES_KEPT) c.ring.delete(c.ring.keys().next().value);
  c.player.boxesCame(f.media_time);
  // Its picture is on screen already: drawn now (late, on the right picture).
  if (c.shown === key && c.onScreen !== f) show(c, f, false, true);
}

// The frame of the picture at `key`: its own (or one within half a picture), else the one
// before it when the frames known skip this picture (a detector on some pictures only).
function frameOf(c, key) {
  const half = (c.player.frameS * c.player.timescale) / 2;
  let near = null, before = null, after = false;
  for (const [k, f] of c.ring) {
    if (Math.abs(k - key) <= half && (!near || Math.abs(k - key) < Math.abs(near.key - key))) near = f;
    if (k < key && (!before || k > before.key)) before = f;
    if (k > key) after = true;
  }
  if (near) return [near, false];
  return after && before ? [before, true] : [null, false];
}

// A picture presented (requestVideoFrameCallback's mediaTime): its boxes drawn.
function presented(c, mediaTime) {
  vidflow.videoFrames[c.name] = (vidflow.videoFrames[c.name] || 0) + 1;
  const key = Math.round(mediaTime * c.player.timescale);
  c.shown = key;
  const [f, held] = frameOf(c, key);
  show(c, f, held, false);
}

function show(c, f, held, late) {
  c.onScreen = f;
  c.held = held;
  const drawn = draw(c);
  if (f && !held && f.boxes.length) vidflow.boxesOnVideo[c.name] = (vidflow.boxesOnVideo[c.name] || 0) + 1;
  const log = (vidflow.videoLog[c.name] = vidflow.videoLog[c.name] || []);
  log.push({ t: c.shown / c.player.timescale, frame: f ? f.media_time : null, held, late, boxes: drawn });
  if (log.length > 300) log.shift();
}

document.addEventListener("visibilitychange", () => cams.forEach(playOrNot));

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
