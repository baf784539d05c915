// The page's side of scripts/bench-live-video, run in every document of its tabs before the
// page's own scripts (Page.addScriptToEvaluateOnNewDocument), as one function of its settings.
//
// probe: knows no player. It wraps WebSocket to note when each fragment of a video socket
// (api/video/) arrived, by the fragment's presentation time (tfdt + the trun's composition
// offset, ticks); it finds video[data-source=SOURCE] and, at each requestVideoFrameCallback,
// draws the camera's top band on a small canvas, reads the picture's number and capture time
// (4 rows of 32 blocks: the time's low 32 bits, their complement, the number, its complement)
// and keeps [Date.now(), mediaTime in ticks, number, capture ms, arrival ms, presentedFrames,
// ms buffered beyond the picture] in window.vt, which the bench takes every second.
//
// player: the page's way to play a camera, for as long as the page has no tile of its own
// (c.page false): a <video data-source=SOURCE>, Media Source Extensions fed from
// new WebSocket("api/video/SOURCE"), tests/video.rs's player plus a live-edge rule: it starts
// TARGET s before the end of what is buffered; more than TARGET + 0.1 s behind, it plays at
// CATCH_UP times the speed until it is back; more than LAG_BOUND s behind, or in no buffered
// range (a skip's gap), it jumps to TARGET before the end. What was played more than 30 s ago is
// removed. Pointing the bench at the real page is c.page true: the probe alone, on the page's
// own tile.
(c) => {
  const probe = () => {
    const SOURCE = c.source, W = c.width, BW = c.blockWidth, BH = c.blockHeight, BITS = 32, DOWN = 3, TWO32 = 4294967296;
    const vt = window.vt = { samples: [], arrivals: new Map(), opened: null, first: null, errors: [], jumps: 0, stalls: 0 };
    vt.take = () => { const s = vt.samples; vt.samples = []; return s; };
    // A fragment's presentation time (ticks): its tfdt, plus its trun's composition offset.
    const pts = (buf) => {
      const b = new Uint8Array(buf, 0, Math.min(buf.byteLength, 512)), d = new DataView(buf);
      let dts = null, cto = 0;
      for (let i = 4; i + 8 <= b.length; i++) {
        const box = String.fromCharCode(b[i], b[i + 1], b[i + 2], b[i + 3]);
        if (box === 'tfdt') dts = b[i + 4] === 1 ? d.getUint32(i + 8) * TWO32 + d.getUint32(i + 12) : d.getUint32(i + 8);
        if (box === 'trun') {
          const f = d.getUint32(i + 4) & 0xffffff;
          let at = i + 12 + (f & 1 ? 4 : 0) + (f & 4 ? 4 : 0) + (f & 0x100 ? 4 : 0) + (f & 0x200 ? 4 : 0) + (f & 0x400 ? 4 : 0);
          if (f & 0x800) cto = d.getInt32(at);
          break;
        }
      }
      return dts === null ? null : Math.round(dts + cto);
    };
    // Any video socket, the page's or the bench's player's: when each fragment arrived.
    const Native = window.WebSocket;
    window.WebSocket = class extends Native {
      constructor(...args) {
        super(...args);
        if (!String(args[0]).includes('api/video/')) return;
        if (vt.opened === null) vt.opened = performance.now();
        this.addEventListener('message', (m) => {
          if (!(m.data instanceof ArrayBuffer)) return;
          const t = pts(m.data);
          if (t === null) return;
          vt.arrivals.set(t, Date.now());
          if (vt.arrivals.size > 4000) vt.arrivals.delete(vt.arrivals.keys().next().value);
        });
      }
    };
    const canvas = document.createElement('canvas');
    canvas.width = BITS * BW / DOWN; canvas.height = 4 * BH / DOWN;
    const ctx = canvas.getContext('2d', { willReadFrequently: true });
    const read = (v) => {
      const s = v.videoWidth / W;
      ctx.drawImage(v, 0, 0, BITS * BW * s, 4 * BH * s, 0, 0, canvas.width, canvas.height);
      const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
      const words = [];
      for (let r = 0; r < 4; r++) {
        const y = Math.floor((r * BH + BH / 2) / DOWN);
        let w = 0;
        for (let i = 0; i < BITS; i++) w = w * 2 + (px[(y * canvas.width + Math.floor((i * BW + BW / 2) / DOWN)) * 4] > 127 ? 1 : 0);
        words.push(w);
      }
      return words[0] + words[1] === TWO32 - 1 && words[2] + words[3] === TWO32 - 1 ? [words[0], words[2]] : null;
    };
    const watch = (v) => {
      v.addEventListener('waiting', () => { vt.stalls++; });
      const presented = (now, meta) => {
        const wall = Date.now();
        if (vt.first === null) vt.first = performance.now();
        const got = read(v);
        const ticks = Math.round(meta.mediaTime * 90000);
        let capture = null;
        if (got) {
          let back = ((wall % TWO32) - got[0] + TWO32) % TWO32;
          if (back > TWO32 / 2) back -= TWO32;
          capture = wall - back;
        }
        const arrival = vt.arrivals.get(ticks);
        const b = v.buffered;
        const ahead = b.length ? Math.round((b.end(b.length - 1) - meta.mediaTime) * 1000) : null;
        vt.samples.push([wall, ticks, got ? got[1] : null, capture, arrival === undefined ? null : arrival, meta.presentedFrames, ahead]);
        v.requestVideoFrameCallback(presented);
      };
      v.requestVideoFrameCallback(presented);
    };
    const find = () => {
      const v = document.querySelector('video[data-source="' + SOURCE + '"]');
      if (v) watch(v); else setTimeout(find, 5);
    };
    find();
  };
  const player = () => {
    const SOURCE = c.source, LAG_BOUND = c.lagBound, TARGET = c.target, CATCH_UP = c.catchUp, INFINITE = c.infinite;
    const start = () => {
      const v = document.createElement('video');
      v.dataset.source = SOURCE; v.muted = true; v.playsInline = true; v.style.width = '640px';
      document.body.appendChild(v);
      const ms = new MediaSource();
      v.src = URL.createObjectURL(ms);
      v.onerror = () => { vt.errors.push('video: ' + (v.error && v.error.message)); };
      ms.addEventListener('sourceopen', () => {
        if (INFINITE) ms.duration = Infinity;
        const ws = new WebSocket(new URL('api/video/' + SOURCE, location.href).href.replace(/^http/, 'ws'));
        ws.binaryType = 'arraybuffer';
        let sb = null, started = false;
        const queue = [];
        const edge = () => {
          const b = sb.buffered;
          if (!b.length || v.seeking) return false;
          const end = b.end(b.length - 1), t = v.currentTime, to = Math.max(b.start(b.length - 1), end - TARGET);
          if (!started) {
            started = true; v.currentTime = to;
            v.play().catch((e) => { vt.errors.push(String(e)); });
            return false;
          }
          let inside = false;
          for (let i = 0; i < b.length; i++) if (b.start(i) <= t && t <= b.end(i)) inside = true;
          const lag = end - t;
          if (!inside || lag > LAG_BOUND) { v.currentTime = to; v.playbackRate = 1; vt.jumps++; }
          else if (lag > TARGET + 0.1) v.playbackRate = CATCH_UP;
          else if (lag <= TARGET) v.playbackRate = 1;
          if (t - b.start(0) > 30) { sb.remove(b.start(0), t - 10); return true; }
          return false;
        };
        const pump = () => {
          if (!sb || sb.updating || edge()) return;
          if (queue.length) sb.appendBuffer(queue.shift());
        };
        ws.onerror = () => { vt.errors.push('websocket error'); };
        ws.onmessage = (m) => {
          if (typeof m.data === 'string') {
            const hello = JSON.parse(m.data);
            if (!MediaSource.isTypeSupported(hello.mime)) { vt.errors.push('not supported: ' + hello.mime); return; }
            sb = ms.addSourceBuffer(hello.mime);
            sb.addEventListener('updateend', pump);
            return;
          }
          queue.push(m.data);
          pump();
        };
      }, { once: true });
    };
    if (document.body) start(); else document.addEventListener('DOMContentLoaded', start);
  };
  probe();
  if (!c.page) player();
}
