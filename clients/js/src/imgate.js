// imgate-client: the JavaScript SDK of the imgate gateway (docs/protocol.md).
// Plain ES module, no dependencies: browsers, and Node 20 with
// --experimental-websocket (or a WebSocket constructor passed in).

import { Emitter, ImError, backoffDelay, frameText, jwtClaims, randomHex, withDevice, withToken } from "./util.js";
import { Rooms } from "./rooms.js";
import { Inbox } from "./inbox.js";
import { Calls } from "./calls.js";
import { httpJson } from "./http.js";

export { ImError } from "./util.js";

const PRESENCE_MAX = 500; // users of one presence_sub
const AUTH_RETRIES = 3; // refused tokens in a row (with getToken) before giving up
const CLIENT_CLOSE = 1000;
const MAX_TIMER_MS = 2 ** 31 - 1; // setTimeout's longest delay
const SEND = { resend: true, isSend: true, timeoutMs: 0 }; // kept until acked, same cmid

const DEFAULTS = {
  backoff: { minMs: 200, maxMs: 10000 },
  recvAckDelayMs: 100,
  lastMid: 0,
  pingIntervalMs: 25000,
  pingTimeoutMs: 10000,
  openTimeoutMs: 10000,
  requestTimeoutMs: 15000,
  httpTimeoutMs: 15000,
  refreshAheadMs: 30000,
  syncPageSize: 100,
  catchUpSyncMs: 5000,
  maxInflightSends: 32,
  dedupMax: 5000,
  roomDedupMax: 1000,
  roomRecoverJumps: true,
  roomRecoverIntervalMs: 2000,
};

function trimSlash(u) {
  return u.replace(/\/+$/, "");
}

export class ImClient extends Emitter {
  constructor(opts = {}) {
    super();
    const urls = opts.urls ?? (opts.url ? [opts.url] : []);
    if (!Array.isArray(urls) || urls.length === 0) throw new TypeError("url or urls is required");
    this._urls = urls.slice();
    let http = opts.httpUrls ?? (opts.httpUrl ? [opts.httpUrl] : null);
    if (http && http.length === 1) http = urls.map(() => http[0]);
    if (http && http.length !== urls.length) throw new TypeError("httpUrls must be parallel to urls");
    this._httpUrls = http ? http.map(trimSlash) : null;
    if (!opts.token && typeof opts.getToken !== "function") throw new TypeError("token or getToken is required");
    this._token = opts.token || null;
    this._getToken = typeof opts.getToken === "function" ? opts.getToken : null;
    this._WS = opts.WebSocket ?? globalThis.WebSocket;
    // The login policy's slot (IM_LOGIN_POLICY): a stable id per install, and its platform.
    this._device = opts.device;
    this._platform = opts.platform;
    this._fetch = opts.fetch ?? (globalThis.fetch ? globalThis.fetch.bind(globalThis) : null);
    const o = { ...DEFAULTS, ...opts };
    this.backoff = { ...DEFAULTS.backoff, ...(opts.backoff || {}) };
    this.pingIntervalMs = o.pingIntervalMs;
    this.pingTimeoutMs = o.pingTimeoutMs;
    this.openTimeoutMs = o.openTimeoutMs;
    this.httpTimeoutMs = o.httpTimeoutMs;
    this.refreshAheadMs = o.refreshAheadMs;
    /** The sync cursor: every message up to it was delivered (persist it via "cursor"). */
    this.lastMid = Number(o.lastMid) || 0;

    this._state = "offline";
    this._stopped = false;
    this._ws = null;
    this._gen = 0; // bumped whenever a socket is let go: its late events are ignored
    this._isOpen = false;
    this._opening = false;
    this._tried = false; // a connection was attempted (getToken for the next ones)
    this._urlIndex = 0;
    this._attempt = 0;
    this._authFailures = 0;
    this._ready = null;
    this._calls = new Calls(this, o);
    this._cmidPrefix = "js" + randomHex();
    this._cmidSeq = 0;
    this._inbox = new Inbox(this, o);
    this._watched = new Set();
    this._rooms = new Rooms(this, o.roomDedupMax, { recoverJumps: o.roomRecoverJumps !== false, recoverIntervalMs: o.roomRecoverIntervalMs });
    this._lastRecv = 0;
    this._timers = {};
  }

  /** "connecting" | "online" | "offline" | "stopped" */
  get state() {
    return this._state;
  }

  /** The user id (`sub`) of the current token, if it is a readable JWT. */
  get user() {
    const c = jwtClaims(this._token);
    return c && typeof c.sub === "string" ? c.sub : null;
  }

  /** The WebSocket URL in use (or to be tried next). */
  get url() {
    return this._urls[this._urlIndex];
  }

  // -- lifecycle -------------------------------------------------------------------
  connect() {
    if (this._stopped) return Promise.reject(new ImError("stopped", "client is stopped"));
    if (typeof this._WS !== "function") {
      return Promise.reject(new ImError("no_websocket", "no WebSocket: pass one, or run node with --experimental-websocket"));
    }
    if (this._state === "online") return Promise.resolve();
    if (!this._ready) {
      let resolve, reject;
      const promise = new Promise((res, rej) => ((resolve = res), (reject = rej)));
      promise.catch(() => {}); // a rejection nobody awaits is no unhandled one
      this._ready = { promise, resolve, reject };
    }
    if (!this._ws && !this._opening && !this._timers.reconnect) this._open();
    return this._ready.promise;
  }

  close() {
    this._stop(new ImError("stopped", "client closed"));
  }

  _setState(s) {
    if (this._state === s) return;
    this._state = s;
    this.emit("state", s);
  }

  _timer(name, ms, fn) {
    clearTimeout(this._timers[name]);
    this._timers[name] = setTimeout(() => {
      delete this._timers[name];
      fn();
    }, Math.max(0, ms));
  }

  _clear(...names) {
    for (const n of names) {
      clearTimeout(this._timers[n]);
      delete this._timers[n];
    }
  }

  async _tokenForAttempt() {
    if ((!this._tried && this._token) || !this._getToken) return this._token;
    const t = await this._getToken();
    if (typeof t !== "string" || !t) throw new ImError("unauthorized", "getToken gave no token");
    this._token = t;
    return t;
  }

  async _open() {
    if (this._stopped) return;
    this._opening = true;
    this._setState("connecting");
    let token;
    try {
      token = await this._tokenForAttempt();
    } catch (err) {
      this._opening = false;
      if (this._stopped) return;
      this.emit("error", err instanceof ImError ? err : new ImError("token", `getToken failed: ${err && err.message}`, { cause: err }));
      this._retry(true);
      return;
    }
    this._tried = true;
    this._opening = false;
    if (this._stopped) return;
    const gen = ++this._gen;
    let ws;
    try {
      ws = new this._WS(withDevice(withToken(this._urls[this._urlIndex], token), this._device, this._platform));
    } catch (err) {
      this.emit("error", new ImError("connect", `cannot open ${this.url}: ${err && err.message}`));
      this._retry(true);
      return;
    }
    this._ws = ws;
    this._isOpen = false;
    ws.onopen = () => gen === this._gen && this._onOpen(gen);
    ws.onmessage = (ev) => gen === this._gen && this._onMessage(ev.data);
    ws.onclose = (ev) => gen === this._gen && this._onSocketClosed(ev.code, ev.reason);
    // A close event should follow an error; Node 20's WebSocket sends none when it cannot connect.
    ws.onerror = () => {
      if (gen !== this._gen) return;
      if (!this._isOpen) this._onSocketClosed(1006, "connection failed");
      else this._timer("errClose", 1000, () => gen === this._gen && this._drop(1006, "socket error", true));
    };
    this._timer("open", this.openTimeoutMs, () => gen === this._gen && this._drop(4000, "open timed out", true));
  }

  _onOpen(gen) {
    this._clear("open");
    this._isOpen = true;
    this._lastRecv = Date.now();
    this._keepalive();
    this._calls.opened(); // what was not answered, again: sends with the same cmid
    this._inbox.flushAcks();
    this._resubscribe();
    this._rooms.rejoinAll();
    this._scheduleRefresh();
    if (!this._httpUrls) {
      this._online();
      return;
    }
    // The node reads a connection's frames only once the device is registered
    // (its route written, its groups loaded): a message acked after the pong is
    // pushed here, one acked before is in the sync. Syncing earlier could miss
    // one acked in between.
    this._call({ op: "ping" })
      .catch(() => undefined) // (lost: the next connection syncs; else the sync says)
      .then(() => (gen === this._gen ? this.sync() : undefined))
      .then(
        () => gen === this._gen && this._isOpen && this._online(),
        (err) => {
          if (gen !== this._gen || this._stopped) return;
          if (err.status === 403) return this._stop(err); // banned
          this._detach(true);
          this.emit("closed", { code: CLIENT_CLOSE, reason: "sync failed" });
          if (err.status === 401) return this._authRefused(err);
          this.emit("error", err);
          this._retry(true);
        },
      );
  }

  _online() {
    this._attempt = 0;
    this._authFailures = 0;
    this._setState("online");
    if (this._ready) {
      this._ready.resolve();
      this._ready = null;
    }
  }

  /** Let the current socket go (no more of its events), keeping resendable calls. */
  _detach(closeIt) {
    const ws = this._ws;
    this._gen++;
    this._ws = null;
    this._isOpen = false;
    this._clear("open", "ping", "refresh", "errClose");
    if (ws) {
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
      if (closeIt) {
        try {
          ws.close(CLIENT_CLOSE);
        } catch {
          /* already closing */
        }
      }
    }
    this._calls.detached();
  }

  /** Give up on the socket ourselves (ping timeout, sync failure, reconnect frame). */
  _drop(code, reason, failed) {
    const opened = this._isOpen;
    this._detach(true);
    this.emit("closed", { code, reason });
    if (this._stopped) return;
    if (!failed) {
      this._next(0);
      return;
    }
    this._failed(opened);
  }

  _onSocketClosed(code, reason) {
    const opened = this._isOpen;
    this._detach(false);
    this.emit("closed", { code, reason });
    if (this._stopped) return;
    if (code === 4005) {
      // Another connection of this user took this device's slot (the login policy):
      // reconnecting would only take it back. The application decides.
      this._stop(new ImError("replaced", reason || "replaced by a newer connection", { closeCode: 4005 }));
    } else if (code === 4003) {
      this._stop(new ImError("forbidden", reason || "closed by the server (kicked, banned or revoked)", { closeCode: 4003 }));
    } else if (code === 4001) {
      if (!this._getToken) this._stop(new ImError("unauthorized", "token expired", { closeCode: 4001 }));
      else this._schedule(0); // same node, with a token from getToken
    } else if (code === 1001) {
      this._next(0);
    } else {
      this._failed(opened);
    }
  }

  /** A connection that failed: refused tokens stop the client, anything else backs off. */
  async _failed(opened) {
    if (!opened) {
      const status = await this._probe();
      if (this._stopped) return;
      if (status === 401) return this._authRefused(new ImError("unauthorized", "token refused", { status }));
      if (status === 403) return this._stop(new ImError("forbidden", "user banned", { status }));
    }
    this._retry(true);
  }

  _authRefused(err) {
    this._authFailures++;
    if (!this._getToken || this._authFailures >= AUTH_RETRIES) {
      this._stop(err);
      return;
    }
    this._retry(false); // same node, a fresh token
  }

  _retry(rotate) {
    if (rotate) this._urlIndex = (this._urlIndex + 1) % this._urls.length;
    this._schedule(backoffDelay(this._attempt++, this.backoff));
  }

  _next(delay) {
    this._urlIndex = (this._urlIndex + 1) % this._urls.length;
    this._schedule(delay);
  }

  _schedule(delay) {
    if (this._stopped) return;
    this._setState("offline");
    this._timer("reconnect", delay, () => this._open());
  }

  /** Why a handshake failed: the token's own exp, else the HTTP API's verdict (401/403). */
  async _probe() {
    const claims = jwtClaims(this._token);
    if (claims && typeof claims.exp === "number" && claims.exp * 1000 <= Date.now()) return 401;
    if (!this._httpUrls || !this._fetch) return 0;
    // A token that is no JWT at all is asked about too: the API's 401 stops the client.
    const who = claims && typeof claims.sub === "string" ? claims.sub : "probe";
    try {
      await this._httpOnce("GET", `/v1/presence?users=${encodeURIComponent(who)}`, undefined, this._token);
      return 200;
    } catch (err) {
      return err.status || 0;
    }
  }

  _stop(err) {
    if (this._stopped) return;
    this._stopped = true;
    const wasOpen = this._isOpen;
    if (wasOpen) this._inbox.flushAcks();
    this._calls.stop(err);
    this._rooms.stop(err);
    this._inbox.stop();
    this._detach(true);
    for (const name of Object.keys(this._timers)) this._clear(name);
    if (wasOpen) this.emit("closed", { code: CLIENT_CLOSE, reason: err.message });
    this._setState("stopped");
    if (this._ready) {
      this._ready.reject(err);
      this._ready = null;
    }
  }

  // -- keepalive, token refresh ------------------------------------------------------
  _keepalive() {
    const gen = this._gen;
    const tick = () => {
      if (gen !== this._gen) return;
      const idle = Date.now() - this._lastRecv;
      if (idle < this.pingIntervalMs) {
        this._timer("ping", this.pingIntervalMs - idle, tick);
        return;
      }
      const sentAt = Date.now();
      this._sendFrame({ op: "ping", id: `ka${this._calls.nextId()}` });
      this._timer("ping", this.pingTimeoutMs, () => {
        if (gen !== this._gen) return;
        if (this._lastRecv >= sentAt) tick();
        else this._drop(4000, "ping timeout", true);
      });
    };
    if (this.pingIntervalMs > 0) this._timer("ping", this.pingIntervalMs, tick);
  }

  _scheduleRefresh() {
    this._clear("refresh");
    if (!this._getToken || !(this.refreshAheadMs > 0)) return;
    const c = jwtClaims(this._token);
    if (!c || typeof c.exp !== "number") return;
    const now = Date.now();
    const lifetime = c.exp * 1000 - (typeof c.iat === "number" ? c.iat * 1000 : now);
    const ahead = Math.min(this.refreshAheadMs, lifetime / 2);
    const gen = this._gen;
    const delay = c.exp * 1000 - ahead - now;
    if (delay > MAX_TIMER_MS) {
      this._timer("refresh", MAX_TIMER_MS, () => gen === this._gen && this._scheduleRefresh());
      return;
    }
    this._timer("refresh", delay, async () => {
      try {
        const token = await this._getToken();
        if (gen !== this._gen) return;
        await this._call({ op: "refresh", token });
        this._token = token;
        this._scheduleRefresh();
      } catch (err) {
        // Not fatal: at exp the node closes with 4001 and we reconnect with getToken.
        if (gen === this._gen && err.code !== "disconnected") this.emit("error", err);
      }
    });
  }

  // -- frames ----------------------------------------------------------------------
  _sendFrame(frame) {
    if (!this._isOpen) return false;
    try {
      this._ws.send(JSON.stringify(frame));
      return true;
    } catch {
      return false; // closing: its close event follows
    }
  }

  _call(frame, opts) {
    return this._calls.call(frame, opts);
  }

  _onMessage(data) {
    this._lastRecv = Date.now();
    let f;
    try {
      f = JSON.parse(frameText(data));
    } catch {
      this.emit("error", new ImError("bad_frame", "a frame that is not JSON"));
      return;
    }
    if (!f || typeof f !== "object") return;
    if (f.re !== undefined) {
      if (f.op === "ack" && typeof f.mid === "number") this._inbox.markOwn(f.mid); // never shown as "message"
      if (this._calls.reply(f)) return;
      if (f.op !== "error") return; // a late reply (timed out), or a pong
    }
    switch (f.op) {
      case "msg":
      case "group_msg":
        this._inbox.incoming(f, true);
        break;
      case "room_msgs":
      case "room_gap":
        this._rooms.onRoomMsgs(f);
        break;
      case "reconnect":
        this._drop(1001, "reconnect requested by the node", false);
        break;
      case "recalled":
        if (typeof f.mid === "number") this._inbox.markRecalled(f.mid);
        this.emit("recalled", f);
        break;
      case "edited":
        // Told once: a sync page bringing the same edit makes no second "edited".
        if (typeof f.mid === "number" && !this._inbox.markEdited(f.mid, f.edited)) break;
        this.emit("edited", f);
        break;
      case "left":
        this._rooms.onLeft(f);
        break;
      case "error":
        this.emit("error", new ImError(f.code, f.message, { frame: f }));
        break;
      case "pong":
      case "ok":
        break;
      case "reaction":
        if (typeof f.mid === "number") this._inbox.markReaction(f);
        this.emit("reaction", f);
        break;
      case "read":
      case "receipt":
      case "conv_settings":
      case "typing":
      case "presence":
      case "group_event":
      case "notice":
      case "feed":
        this.emit(f.op, f);
        break;
      default:
        this.emit("unknown", f);
    }
  }

  // -- sync and HTTP -----------------------------------------------------------------
  /** Pages GET /v1/sync from lastMid until done (automatic at each connection). */
  sync() {
    if (this._stopped) return Promise.reject(new ImError("stopped", "client is stopped"));
    return this._inbox.sync();
  }

  /** The HTTP API with the bearer token: JSON in and out; ImError with .status/.code on non-2xx. */
  async http(method, path, body) {
    if (!this._token && this._getToken) this._token = await this._getToken();
    try {
      return await this._httpOnce(method, path, body, this._token);
    } catch (err) {
      if (err.status !== 401 || !this._getToken) throw err;
      const token = await this._getToken();
      if (!token || token === this._token) throw err;
      this._token = token;
      return this._httpOnce(method, path, body, token);
    }
  }

  _httpOnce(method, path, body, token) {
    if (!this._httpUrls) return Promise.reject(new ImError("http", "no httpUrl configured"));
    return httpJson(this._fetch, this._httpUrls[this._urlIndex], method, path, body, token, this.httpTimeoutMs);
  }

  // -- chat --------------------------------------------------------------------------
  _cmid(opts) {
    return (opts && opts.cmid) || `${this._cmidPrefix}.${(++this._cmidSeq).toString(36)}`;
  }

  /** A 1:1 message; the ack frame. Resent with the same cmid over a reconnect until acked. */
  send(to, body, opts) {
    return this._call(withReply({ op: "send", to, cmid: this._cmid(opts), body }, opts), SEND);
  }

  groupSend(group, body, opts) {
    return this._call(withReply({ op: "group_send", group, cmid: this._cmid(opts), body }, opts), SEND);
  }

  /** The sender's new body of message `mid` (within the node's edit window); resent over a reconnect. */
  edit(mid, body) {
    if (body === undefined) return Promise.reject(new TypeError("edit: body is required"));
    return this._call({ op: "edit", mid, body }, { resend: true });
  }

  /** Add (`on`, the default) or remove this user's `emoji` on message `mid`; idempotent, resent over a reconnect. */
  react(mid, emoji, on = true) {
    return this._call({ op: "react", mid, emoji, on: on !== false }, { resend: true });
  }

  /** Who reacted to message `mid` with `emoji`, by user id: `{users, cursor}` (cursor null on the last page). */
  reactionUsers(mid, emoji, { cursor, limit } = {}) {
    const q = new URLSearchParams({ emoji });
    if (cursor) q.set("cursor", cursor);
    if (limit !== undefined && limit !== null) q.set("limit", String(limit));
    return this.http("GET", `/v1/messages/${encodeURIComponent(mid)}/reactions?${q}`);
  }

  /** This user's settings of a conversation (a peer, or `g:GROUP`): only the keys given change. */
  setConversation(conv, settings = {}) {
    const body = {};
    for (const k of ["muted", "pinned", "archived"]) {
      if (settings[k] !== undefined) body[k] = Boolean(settings[k]);
    }
    return this.http("PATCH", `/v1/conversations/${encodeURIComponent(conv)}`, body);
  }

  read(conv, mid) {
    return this._call({ op: "read", conv, mid }, { resend: true });
  }

  recall(mid) {
    return this._call({ op: "recall", mid }, { resend: true });
  }

  /** Fire and forget (dropped while offline). */
  typing(conv) {
    this._sendFrame({ op: "typing", conv });
  }

  async presenceSub(users) {
    for (const u of users) this._watched.add(u);
    const replies = await Promise.all(
      chunks(users, PRESENCE_MAX).map((part) =>
        this._call({ op: "presence_sub", users: part }, { resend: true }).catch((err) => {
          if (err.code === "bad_request") for (const u of part) this._watched.delete(u); // not watched again
          throw err;
        })),
    );
    if (replies.length === 1) return replies[0];
    return { op: "presence", users: Object.assign({}, ...replies.map((r) => r.users)) };
  }

  async presenceUnsub(users) {
    for (const u of users) this._watched.delete(u);
    const ok = { op: "ok" };
    // A new connection watches only what is subscribed again: an unsub cut short is done.
    await Promise.all(
      chunks(users, PRESENCE_MAX).map((part) =>
        this._call({ op: "presence_unsub", users: part }, { onLost: (e) => e.resolve(ok) })),
    );
    return ok;
  }

  /** After a reconnect: watch again (the state comes as "presence" events). */
  _resubscribe() {
    const pending = new Set();
    for (const f of this._calls.waiting("presence_sub")) for (const u of f.users) pending.add(u);
    const users = [...this._watched].filter((u) => !pending.has(u));
    for (const part of chunks(users, PRESENCE_MAX)) {
      this._call({ op: "presence_sub", users: part }, { resend: true }).then(
        (f) => this.emit("presence", { op: "presence", users: f.users }),
        (err) => err.code !== "stopped" && this.emit("error", err),
      );
    }
  }

  // -- rooms -------------------------------------------------------------------------
  join(room, opts) {
    if (this._stopped) return Promise.reject(new ImError("stopped", "client is stopped"));
    return this._rooms.join(room, opts);
  }

  leave(room) {
    return this._rooms.leave(room);
  }

  /** `{epoch, pos}` the client holds for a room (what a rejoin sends as `since`), or null. */
  roomPosition(room) {
    return this._rooms.position(room);
  }

  /** Automatic recovery of jumps in `pos` on or off for a joined room (`room_gap` frames are always acted on). */
  setRoomRecoverJumps(room, on) {
    this._rooms.setRecoverJumps(room, on);
  }

  roomSend(room, body, opts = {}) {
    const frame = { op: "room_send", room, body };
    if (opts.prio) frame.prio = opts.prio;
    if (!this._isOpen && !this._stopped) return Promise.reject(new ImError("offline", "not connected"));
    return this._call(frame);
  }
}

/** `frame` with `reply_to` when the options name a message it answers. */
function withReply(frame, opts) {
  const to = opts && opts.replyTo;
  if (to !== undefined && to !== null && to !== 0) frame.reply_to = to;
  return frame;
}

function chunks(list, size) {
  const out = [];
  for (let i = 0; i < list.length; i += size) out.push(list.slice(i, i + size));
  return out;
}
