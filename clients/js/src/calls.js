// Requests of one ImClient and their replies (paired by `id` / `re`), across
// connections: sends are kept until acked and written again on the next
// connection with the same cmid; a bounded number of them is in flight at
// once, and `rate_limited` holds them back for a while instead of failing.

import { ImError } from "./util.js";

const PAUSE_MIN_MS = 250; // after a rate_limited send, sends wait this long, doubling...
const PAUSE_MAX_MS = 5000; // ...up to this

export class Calls {
  /** @param {import("./imgate.js").ImClient} client */
  constructor(client, { requestTimeoutMs, maxInflightSends }) {
    this.client = client;
    this.requestTimeoutMs = requestTimeoutMs;
    this.maxInflightSends = Math.max(1, maxInflightSends | 0);
    this.window = this.maxInflightSends; // sends in flight at most: halved by rate_limited, +1 per ack
    this.pending = new Set(); // every call not answered yet, in the order made
    this.byId = new Map(); // those written on the current socket, by request id
    this.sendQueue = []; // sends not written on the current socket yet, oldest first
    this.sendsInFlight = 0;
    this.pause = 0; // ms sends wait after the last rate_limited (0: none)
    this.pauseTimer = null;
    this.seq = 0;
    this.made = 0;
  }

  nextId() {
    return ++this.seq;
  }

  /**
   * A request. `resend`: kept over a disconnection and written again on the next
   * connection (sends, and idempotent ops); else `onLost(entry)` when the socket
   * drops before the reply (default: rejected with code "disconnected"), or at
   * once when no socket is open. `isSend`: paced by the send window.
   */
  call(frame, { resend = false, isSend = false, timeoutMs = this.requestTimeoutMs, onLost } = {}) {
    const c = this.client;
    if (c._stopped) return Promise.reject(new ImError("stopped", "client is stopped"));
    return new Promise((resolve, reject) => {
      const entry = {
        frame, resolve, reject, resend, isSend, timeoutMs, id: null, timer: null, order: ++this.made,
        onLost: onLost || ((e) => e.reject(new ImError("disconnected", "connection lost before the reply", { frame }))),
      };
      if (!resend && !c._isOpen) {
        entry.onLost(entry);
        return;
      }
      this.pending.add(entry);
      if (isSend) {
        this.sendQueue.push(entry);
        this.pump();
      } else if (c._isOpen) {
        this.write(entry);
      }
    });
  }

  write(entry) {
    entry.id = this.nextId();
    this.byId.set(entry.id, entry);
    if (entry.isSend) this.sendsInFlight++;
    if (entry.timeoutMs > 0) {
      entry.timer = setTimeout(() => {
        this.byId.delete(entry.id);
        this.pending.delete(entry);
        if (entry.isSend) this.sendsInFlight--;
        entry.reject(new ImError("timeout", `no reply to ${entry.frame.op}`, { frame: entry.frame }));
      }, entry.timeoutMs);
    }
    this.client._sendFrame({ ...entry.frame, id: entry.id });
  }

  /** Write queued sends while the window has room and no rate_limited pause runs. */
  pump() {
    if (!this.client._isOpen || this.pauseTimer) return;
    while (this.sendQueue.length && this.sendsInFlight < this.window) {
      const entry = this.sendQueue.shift();
      if (this.pending.has(entry)) this.write(entry);
    }
  }

  /** A socket opened: every call kept is written again (sends through the window). */
  opened() {
    this.window = this.maxInflightSends; // a new connection has a full send budget
    this.pause = 0;
    this.sendQueue = [];
    for (const entry of this.pending) {
      if (entry.isSend) this.sendQueue.push(entry);
      else this.write(entry);
    }
    this.pump();
  }

  /** The socket is gone: resendable calls wait for the next, the others are lost. */
  detached() {
    this.byId.clear();
    this.sendsInFlight = 0;
    clearTimeout(this.pauseTimer);
    this.pauseTimer = null;
    for (const entry of [...this.pending]) {
      clearTimeout(entry.timer);
      entry.id = null;
      if (entry.resend) continue;
      this.pending.delete(entry);
      entry.onLost(entry);
    }
  }

  /** Settles the call `f` answers; false if `f` answers none. */
  reply(f) {
    const entry = this.byId.get(f.re);
    if (!entry) return false;
    this.byId.delete(f.re);
    clearTimeout(entry.timer);
    if (entry.isSend) this.sendsInFlight--;
    if (entry.isSend && f.op === "error" && f.code === "rate_limited") {
      // Flow control, not a verdict on the message: the same cmid again after a pause.
      entry.id = null;
      const at = this.sendQueue.findIndex((e) => e.order > entry.order);
      this.sendQueue.splice(at < 0 ? this.sendQueue.length : at, 0, entry);
      if (!this.pauseTimer) {
        // Once per burst of refusals: fewer in flight, a longer wait (the node closes
        // a connection that keeps earning rate_limited: IM_REFUSE_BURST).
        this.window = Math.max(1, this.window >> 1);
        this.pause = Math.min(PAUSE_MAX_MS, this.pause ? this.pause * 2 : PAUSE_MIN_MS);
        this.pauseTimer = setTimeout(() => {
          this.pauseTimer = null;
          this.pump();
        }, this.pause);
      }
      return true;
    }
    this.pending.delete(entry);
    if (f.op === "error") {
      entry.reject(new ImError(f.code, f.message, { frame: f, cmid: entry.frame.cmid }));
    } else {
      if (entry.isSend && this.window < this.maxInflightSends && ++this.window === this.maxInflightSends) this.pause = 0;
      entry.resolve(f);
    }
    if (entry.isSend) this.pump();
    return true;
  }

  /** Ops of the calls waiting (for the presence resubscription). */
  *waiting(op) {
    for (const e of this.pending) if (e.frame.op === op) yield e.frame;
  }

  stop(err) {
    clearTimeout(this.pauseTimer);
    this.pauseTimer = null;
    this.sendQueue = [];
    for (const entry of [...this.pending]) {
      this.pending.delete(entry);
      clearTimeout(entry.timer);
      entry.reject(err);
    }
  }
}
