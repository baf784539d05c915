// vidflow's live video, for one camera tile of the page (app.js makes one per tile that plays
// video): the camera's own H.264 or H.265, never re-encoded, from `api/video/NAME` over a
// WebSocket (a text message {codec, mime, origin_ms, timescale}, then the init segment and one
// fragment per picture, from the current group of pictures' keyframe), played through Media
// Source Extensions when `MediaSource.isTypeSupported` says the browser plays the codec (else
// the tile shows stills and says why: "this browser cannot play H.265 (hvc1.1.6.L93.B0)").
// A WebSocket, not a long response: a browser opens at most six HTTP/1.1 connections per
// host, and does not count WebSockets among them, so a page of 16 cameras still loads its
// events, counts and health.
//
// - Which picture is on screen: `requestVideoFrameCallback` gives each presented picture's
//   `mediaTime`, which is the `media_time` of the live frame that holds its boxes (`onFrame`).
// - Staying live: the picture on screen is kept `delay` behind the newest picture received
//   (enough for the browser not to run dry, and for the boxes, which come after the picture
//   once the detector ran on it); past BEHIND_S more than that, the player jumps to the live
//   edge; a little behind, it plays 10% faster until caught up (see `keepLive`).
// - Memory: what is buffered more than KEEP_S behind the picture on screen is removed, from a
//   keyframe on, so the group of pictures being played is kept whole.
// - Failures: a closed WebSocket or a media error is tried again after 1 s, doubling up to
//   30 s (each wait drawn between half and all of it, as the live stream's); after GIVE_UP
//   failures in a row the tile shows stills and says so, and video is still tried at that pace.
// - Each connection plays in a MediaSource of its own: a stream that starts again (vidflow
//   restarted, the camera's settings or codec changed: vidflow then closes the connection)
//   starts a new timeline, with the codec its first message names.
"use strict";

const LIVE_VIDEO = {
  RETRY_FIRST_MS: 1000,
  RETRY_MAX_MS: 30000,
  GIVE_UP: 4,
  // How far behind the picture on screen may fall, past the delay aimed at, before the player
  // jumps to the live edge: above the jitter of a network and a busy page (a few pictures), so
  // it never jumps in normal play (a jump costs a visible hitch: the browser decodes again
  // from the keyframe), and well under the 1 s past which vidflow skips a viewer forward.
  BEHIND_S: 0.5,
  // Behind the delay by more than this (and less than BEHIND_S), play 10% faster: drift taken
  // back unseen.
  NUDGE_S: 0.1,
  // The delay aimed at behind the newest picture received: at least MIN_DELAY_S (a few
  // pictures, so that the browser does not run dry between two), more when the boxes come
  // later than their pictures, up to MAX_DELAY_S (past that the boxes come late, not the video).
  MIN_DELAY_S: 0.15,
  MAX_DELAY_S: 1.0,
  // Buffered video kept behind the picture on screen.
  KEEP_S: 10,
  // Bytes received and not yet appended, at most: past that the browser does not keep up.
  QUEUE_BYTES: 16 * 1024 * 1024,
  // Connections that lived this long and presented pictures end a run of failures.
  GOOD_RUN_MS: 30000,
};

// The MediaSource of this browser: ManagedMediaSource on iPhones (Safari 17.1 on).
const MediaSourceOf = window.MediaSource || window.ManagedMediaSource;

// Why this browser plays no live video at all, or null.
function videoUnsupported() {
  if (!MediaSourceOf) return "this browser has no Media Source Extensions";
  if (!("requestVideoFrameCallback" in HTMLVideoElement.prototype)) {
    return "this browser cannot say which picture it shows (requestVideoFrameCallback)";
  }
  return null;
}

// A codec string as a tile says it: H.265's with its name ("H.265 (hvc1.1.6.L93.B0)"), which
// few people know by its string; H.264's as it is.
function codecName(codec) {
  return /^(hvc1|hev1)\./.test(codec) ? `H.265 (${codec})` : codec;
}

// A fragment's first picture, from its `moof`: whether it is a keyframe, its presentation time
// and duration, in the stream's ticks; null for anything else (the init segment).
function fragmentOf(bytes) {
  const d = new DataView(bytes);
  if (bytes.byteLength < 16 || d.getUint32(4) !== 0x6d6f6f66) return null; // "moof"
  const end = Math.min(d.getUint32(0), bytes.byteLength);
  let decode = null, picture = null;
  // The boxes inside moof and traf, by their sizes.
  const walk = (from, to) => {
    for (let at = from; at + 8 <= to;) {
      const size = d.getUint32(at), kind = d.getUint32(at + 4);
      if (size < 8) return;
      if (kind === 0x74726166) walk(at + 8, at + size); // "traf"
      else if (kind === 0x74666474) { // "tfdt"
        decode = d.getUint8(at + 8) === 1 ? d.getUint32(at + 12) * 2 ** 32 + d.getUint32(at + 16) : d.getUint32(at + 12);
      } else if (kind === 0x7472756e) picture = trun(d, at); // "trun"
      at += size;
    }
  };
  walk(8, end);
  if (decode === null || !picture) return null;
  return { keyframe: picture.keyframe, time: decode + picture.offset, duration: picture.duration };
}

// A `trun`'s first sample: its flags (keyframe: not a non-sync sample), composition offset and
// duration, the fields that its flags say are there.
function trun(d, at) {
  const flags = d.getUint32(at + 8) & 0xffffff, count = d.getUint32(at + 12);
  if (!count) return null;
  let p = at + 16;
  if (flags & 0x1) p += 4; // data offset
  let sampleFlags = null;
  if (flags & 0x4) { sampleFlags = d.getUint32(p); p += 4; } // first sample's flags
  let duration = 0, offset = 0;
  if (flags & 0x100) { duration = d.getUint32(p); p += 4; }
  if (flags & 0x200) p += 4; // size
  if (flags & 0x400) { sampleFlags = sampleFlags ?? d.getUint32(p); p += 4; }
  if (flags & 0x800) offset = d.getInt32(p);
  return { keyframe: sampleFlags === null || !(sampleFlags & 0x10000), offset, duration };
}

class LiveVideo {
  // `video`: the tile's element; `on`: the tile's hooks: frame(mediaTime) for each picture
  // presented, playing() at the first picture of a connection, failing(why, waitMs, failures),
  // unsupported(why) when this browser cannot play the camera's codec.
  constructor(name, video, on, paced) {
    Object.assign(this, { name, video, on, paced });
    this.ws = null;
    this.ms = null;
    this.sb = null;
    this.timescale = 90000;
    this.queue = [];
    this.queued = 0;
    this.keyframes = []; // presentation times (s) of the keyframes buffered
    this.newest = 0; // end of the newest picture received (s)
    this.frameS = 1 / 25; // a picture's duration (s): the shortest of the connection's
    this.shortest = Infinity; // (a stream vidflow encodes has longer ones where it dropped a frame)
    this.lags = []; // how long after its picture each frame's boxes came (s)
    this.delay = LIVE_VIDEO.MIN_DELAY_S;
    this.speed = { at: 0, from: 0, rate: 1 }; // media seconds received per second
    this.failures = 0;
    this.retry = null;
    this.running = false;
    this.stats = { jumps: 0, trims: 0, reconnects: 0 };
    this.presented = (now, meta) => {
      this.handle = video.requestVideoFrameCallback(this.presented);
      if (!this.running) return;
      if (!this.presentedOn++) this.on.playing();
      this.on.frame(meta.mediaTime);
    };
    video.addEventListener("error", () => {
      if (this.running && this.ms) this.fail("the browser could not play it: " + (video.error && video.error.message || "media error"), true);
    });
  }

  start() {
    if (this.running) return;
    this.running = true;
    this.connect();
  }

  // Closes the connection and lets go of the media (the tile shows stills, or is off screen).
  stop() {
    this.running = false;
    clearTimeout(this.retry);
    this.closeSocket();
    this.closeMedia();
  }

  connect() {
    this.retry = null;
    const url = new URL("api/video/" + encodeURIComponent(this.name), location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.opened = performance.now();
    this.presentedOn = 0;
    this.error = null;
    let open = false;
    ws.onopen = () => (open = true);
    ws.onmessage = (m) => this.ws === ws && this.message(m.data);
    // A refusal (503: vidflow has as many live clients as it takes) is not told to a page.
    ws.onclose = (e) => this.ws === ws && this.fail(this.error || (open ? `the connection closed (${e.code})` : "vidflow refused it or is not reachable"));
  }

  message(data) {
    if (typeof data === "string") {
      const hello = JSON.parse(data);
      if (hello.error) {
        this.error = hello.error; // vidflow closes the connection next
        return;
      }
      this.timescale = hello.timescale || 90000;
      this.shortest = Infinity;
      // Asked before any media is opened: a browser without the codec (H.265 in many) shows
      // stills and says why, once; the tile does not try again.
      const mime = `video/mp4; codecs="${hello.codec}"`;
      if (!MediaSourceOf.isTypeSupported(mime)) {
        this.stop();
        this.on.unsupported(`this browser cannot play ${codecName(hello.codec)}`);
        return;
      }
      // Each connection in a MediaSource of its own: a stream that starts again (vidflow
      // restarted; the camera's settings, or its codec, changed) starts a new timeline.
      this.openMedia(mime);
      return;
    }
    const f = fragmentOf(data);
    if (f) {
      const t = f.time / this.timescale;
      if (f.keyframe) this.keyframes.push(t);
      if (f.duration) {
        this.shortest = Math.min(this.shortest, f.duration);
        this.frameS = this.shortest / this.timescale;
      }
      this.received(t + (f.duration || 0) / this.timescale);
    }
    this.queue.push(data);
    this.queued += data.byteLength;
    if (this.queued > LIVE_VIDEO.QUEUE_BYTES) this.fail("the browser does not keep up with the camera", true);
    else this.pump();
  }

  // A picture received ends at `end`: the newest, and how fast pictures come, measured over
  // 2 s (a file is read as fast as the pipeline takes it, not at its own rate).
  received(end) {
    this.newest = Math.max(this.newest, end);
    const now = performance.now() / 1000, s = this.speed;
    if (!s.at) Object.assign(s, { at: now, from: this.newest });
    else if (now - s.at >= 2) Object.assign(s, { rate: (this.newest - s.from) / (now - s.at), at: now, from: this.newest });
  }

  openMedia(mime) {
    this.closeMedia();
    const ms = new MediaSourceOf();
    this.ms = ms;
    this.video.disableRemotePlayback = true; // ManagedMediaSource wants it
    this.video.cancelVideoFrameCallback(this.handle);
    this.handle = this.video.requestVideoFrameCallback(this.presented);
    const url = URL.createObjectURL(ms);
    ms.addEventListener("sourceopen", () => {
      URL.revokeObjectURL(url);
      if (this.ms !== ms) return;
      try {
        const sb = ms.addSourceBuffer(mime);
        sb.addEventListener("updateend", () => this.sb === sb && this.updated());
        this.sb = sb;
        this.pump();
      } catch (e) {
        this.fail("the browser refused the stream: " + e.message, true);
      }
    }, { once: true });
    this.video.src = url;
  }

  closeMedia() {
    this.sb = null;
    this.ms = null;
    this.keyframes = [];
    this.newest = 0;
    this.speed = { at: 0, from: 0, rate: 1 };
    if (this.video.getAttribute("src")) {
      this.video.removeAttribute("src");
      this.video.load();
    }
  }

  closeSocket() {
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close();
    this.queue = [];
    this.queued = 0;
  }

  pump() {
    const sb = this.sb;
    if (!sb || sb.updating || !this.queue.length) return;
    const data = this.queue[0];
    try {
      sb.appendBuffer(data);
    } catch (e) {
      // Full: what is behind the picture on screen goes first, then this append again.
      if (e.name === "QuotaExceededError" && this.trim(1)) return;
      this.fail("the browser refused a picture: " + e.message, true);
      return;
    }
    this.queue.shift();
    this.queued -= data.byteLength;
  }

  updated() {
    // Once what came is appended: a backlog (a busy page) is one jump, not one per picture.
    if (!this.queue.length) this.keepLive();
    if (!this.trim(LIVE_VIDEO.KEEP_S)) this.pump();
    this.finish();
  }

  // The source ended (a file read to its end): its last pictures are played, up to the last,
  // which a browser otherwise holds back waiting for more.
  ended(yes) {
    this.ending = yes;
    this.finish();
  }

  finish() {
    const ms = this.ms;
    if (this.ending && ms && ms.readyState === "open" && this.sb && !this.sb.updating && !this.queue.length && this.sb.buffered.length) {
      ms.endOfStream();
    }
  }

  // Keeps the picture on screen `delay` behind the newest received (see the header).
  keepLive() {
    const v = this.video, b = v.buffered;
    if (!b.length || v.seeking) return;
    const start = b.start(b.length - 1), end = b.end(b.length - 1);
    const behind = end - v.currentTime;
    if (v.currentTime < start || behind > this.delay + LIVE_VIDEO.BEHIND_S) {
      // Not yet started, fell behind, or before a gap (vidflow skipped ahead; a reconnection).
      if (v.currentTime > 0 && v.currentTime >= b.start(0)) this.stats.jumps++;
      v.currentTime = Math.max(start, end - this.delay);
    }
    const rate = this.paced ? 1 : Math.min(Math.max(this.speed.rate, 0.1), 4);
    v.playbackRate = behind > this.delay + LIVE_VIDEO.NUDGE_S ? rate * 1.1 : rate;
    if (v.paused && !v.ended) v.play().catch(() => {});
  }

  // Removes what is buffered more than `keep` seconds behind the picture on screen, up to a
  // keyframe (a picture after the cut never depends on one before it); whether it did.
  trim(keep) {
    const sb = this.sb, b = sb && sb.buffered;
    if (!b || !b.length || sb.updating) return false;
    const before = this.video.currentTime - keep;
    let cut = 0;
    for (const k of this.keyframes) if (k <= before) cut = k;
    // Every few seconds, not at each picture (and at once when the buffer is full).
    if (cut - b.start(0) < (keep > 1 ? 5 : 0.01)) return false;
    this.keyframes = this.keyframes.filter((k) => k >= cut);
    sb.remove(0, cut);
    this.stats.trims++;
    return true;
  }

  // A frame's boxes came, for the picture at `mediaTime`: the delay aimed at leaves the boxes
  // of most pictures (9 in 10) time to come before their picture shows.
  boxesCame(mediaTime) {
    if (!this.newest) return;
    this.lags.push(this.newest - this.frameS - mediaTime);
    if (this.lags.length > 50) this.lags.shift();
    const sorted = [...this.lags].sort((a, b) => a - b);
    const p90 = sorted[Math.floor(sorted.length * 0.9)];
    this.delay = Math.min(LIVE_VIDEO.MAX_DELAY_S, Math.max(LIVE_VIDEO.MIN_DELAY_S, p90 + 2 * this.frameS));
  }

  // The connection or the media failed: closed, tried again after the back-off.
  fail(why, media) {
    if (!this.running) return;
    const lived = performance.now() - this.opened;
    if (this.presentedOn && lived > LIVE_VIDEO.GOOD_RUN_MS) this.failures = 0;
    this.closeSocket();
    if (media) this.closeMedia();
    this.failures++;
    const cap = Math.min(LIVE_VIDEO.RETRY_MAX_MS, LIVE_VIDEO.RETRY_FIRST_MS * 2 ** (this.failures - 1));
    const wait = cap * (0.5 + Math.random() / 2);
    this.on.failing(why, wait, this.failures);
    clearTimeout(this.retry);
    this.retry = setTimeout(() => {
      if (!this.running) return;
      this.stats.reconnects++;
      this.connect();
    }, wait);
  }
}
