// vidflow's page: the live tiles (plain JavaScript, no build step; loaded after video.js and
// before app.js, whose helpers it uses when called): each source's tile with its boxes, lines
// and zones drawn over its picture, which is the camera's own video where it plays (video.js),
// else stills; the one live stream (`api/live`) that carries every frame's boxes and the
// stills the page shows.
"use strict";

// ---------------------------------------------------------------- live
const cams = new Map();
const COLORS = ["#22d3ee", "#facc15", "#f472b6", "#4ade80", "#fb923c", "#a78bfa", "#f87171"];

function camera(source) {
  let c = cams.get(source.name);
  if (c) return c;
  const canvas = el("canvas", { class: "boxes", "data-source": source.name });
  const view = el("div", { class: "view" });
  // The camera's own video where it has H.264 or H.265 and the browser plays it (video.js),
  // over a WebSocket each (not counted among the six connections a browser opens per host); else
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
// A tile plays video (video.js) unless the source has none (neither H.264 nor H.265), this
// browser cannot play it, or it failed GIVE_UP times in a row; then it shows stills, and says
// why.
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
  if (c.player) c.player.ended(s.state === "ended");
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
