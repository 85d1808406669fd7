// Test helpers: waiting for events (never sleeping), and a WebSocket that records
// what the client wrote and can be kept from reaching the node.

import { randomBytes } from "node:crypto";
import { ImClient } from "../src/imgate.js";
import { token } from "./nodes.mjs";

/** A user id unique to this run. */
export function uid(prefix = "u") {
  return prefix + randomBytes(4).toString("hex");
}

/**
 * The first `event` of `emitter` whose argument passes `pred`; rejects after
 * `timeoutMs` naming what it waited for.
 */
export function waitEvent(emitter, event, pred = () => true, timeoutMs = 10000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      emitter.off(event, on);
      reject(new Error(`no "${event}" event as expected within ${timeoutMs} ms`));
    }, timeoutMs);
    const on = (arg) => {
      let ok;
      try {
        ok = pred(arg);
      } catch (err) {
        ok = false;
      }
      if (!ok) return;
      clearTimeout(timer);
      emitter.off(event, on);
      resolve(arg);
    };
    emitter.on(event, on);
  });
}

/** Every `event` argument of `emitter` from now on, in an array. */
export function collect(emitter, event) {
  const out = [];
  emitter.on(event, (arg) => out.push(arg));
  return out;
}

/**
 * Resolves once `cond()` holds, checked now and after each `event` of
 * `emitter` (so it waits for what the client receives, not for time).
 */
export function until(emitter, event, cond, timeoutMs = 10000) {
  if (cond()) return Promise.resolve();
  return waitEvent(emitter, event, () => cond(), timeoutMs).then(() => undefined);
}

/** `promise`, or a rejection naming `what` after `ms`. */
export function within(promise, ms, what = "operation") {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

/**
 * A WebSocket class for ImClient's `WebSocket` option that records every
 * connection (`sockets[i].url`, `.sent`: the frames written, parsed) and,
 * while `gate.open` is false, connects to a closed port instead (the node
 * is unreachable). `dropCurrent()` closes the newest socket.
 */
export function recordingWebSocket() {
  const sockets = [];
  const gate = { open: true };
  class RecordingWebSocket extends globalThis.WebSocket {
    constructor(url, protocols) {
      super(gate.open ? url : "ws://127.0.0.1:1/ws", protocols);
      this._rec = { url: url.split("?")[0], reached: gate.open, sent: [], ws: this };
      sockets.push(this._rec);
    }

    send(data) {
      this._rec.sent.push(JSON.parse(data));
      super.send(data);
    }
  }
  return {
    WebSocket: RecordingWebSocket,
    sockets,
    gate,
    dropCurrent() {
      sockets[sockets.length - 1].ws.close();
    },
  };
}

/**
 * ImClients for a test, closed by `closeAll()`: `make(user, nodes, opts)` with
 * `nodes` one node or a list (urls tried in turn), a fresh token, quick backoff.
 */
export function clients() {
  const made = [];
  return {
    make(user, nodes, opts = {}) {
      const list = Array.isArray(nodes) ? nodes : [nodes];
      const c = new ImClient({
        urls: list.map((n) => n.wsUrl),
        httpUrls: list.map((n) => n.httpUrl),
        token: token(user),
        backoff: { minMs: 50, maxMs: 300 },
        ...opts,
      });
      made.push(c);
      return c;
    },
    closeAll() {
      for (const c of made) c.close();
    },
  };
}
