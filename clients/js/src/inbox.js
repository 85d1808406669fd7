// What comes in of 1:1 and group messages: dedup by mid (pushes and sync
// pages alike), what changed in messages already told (edits, counts,
// recalls that sync brings again), batched recv_ack, and the sync of GET /v1/sync.

import { BoundedSet, ImError } from "./util.js";

const RECV_ACK_MAX = 1000; // mids of one recv_ack (gateway/protocol.py)

export class Inbox {
  /** @param {import("./imgate.js").ImClient} client */
  constructor(client, { dedupMax, recvAckDelayMs, catchUpSyncMs, syncPageSize }) {
    this.client = client;
    this.recvAckDelayMs = recvAckDelayMs;
    this.catchUpSyncMs = catchUpSyncMs;
    this.syncPageSize = syncPageSize;
    this.seen = new BoundedSet(dedupMax);
    // mid -> {edited, recalled, reactions}: a message as the application was told of it
    // (its "message", then the pushes about it), to tell what a sync entry changes.
    this.told = new Map();
    this.toldOrder = new BoundedSet(dedupMax, (mid) => this.told.delete(mid)); // bounds told
    this.acks = new Set();
    this.ackTimer = null;
    this.catchUpTimer = null;
    this.syncing = null; // the pass running
    this.syncNext = null; // the pass queued behind it
  }

  _remember(mid, state) {
    this.toldOrder.add(mid);
    this.told.set(mid, state);
  }

  /** A message this client sent (its ack): never shown as "message". */
  markOwn(mid) {
    this.seen.add(mid);
    if (!this.told.has(mid)) this._remember(mid, { edited: 0, recalled: false, reactions: {} });
  }

  /** A `recalled` push. */
  markRecalled(mid) {
    const t = this.told.get(mid);
    if (t) t.recalled = true;
  }

  /** An `edited` push of `mid` made at `at` (unix ms): false if it (or a later one) was already told. */
  markEdited(mid, at) {
    if (typeof at !== "number") return true;
    const t = this.told.get(mid);
    if (!t) {
      this._remember(mid, { edited: at, recalled: false, reactions: {} });
      return true;
    }
    if (t.edited >= at) return false;
    t.edited = at;
    return true;
  }

  /** A `reaction` push: the counts told of the message move with it. */
  markReaction(f) {
    const t = this.told.get(f.mid);
    if (!t || typeof f.emoji !== "string") return;
    const n = (t.reactions[f.emoji] || 0) + (f.on ? 1 : -1);
    if (n > 0) t.reactions[f.emoji] = n;
    else delete t.reactions[f.emoji];
  }

  /**
   * A `msg` / `group_msg` from a push or a sync page (asked `since`): "message" once per mid.
   * Sync also brings again, as they are now, messages this device already had (mids up to
   * `since`: the node's changes; or mids already told): "changed" when they differ from what
   * was told, after "recalled" / "edited" when that is what changed.
   */
  incoming(m, pushed, since = 0) {
    if (!m || typeof m.mid !== "number") return;
    const had = !pushed && since > 0 && m.mid <= since; // acked when it first came
    if (had || this.seen.has(m.mid)) {
      if (!had) this.queueAck(m.mid);
      this.seen.add(m.mid);
      this._changed(m, had);
      return;
    }
    const c = this.client;
    this.queueAck(m.mid);
    this.seen.add(m.mid);
    this._remember(m.mid, stateOf(m));
    c.emit("message", m);
    if (pushed && this.catchUpSyncMs > 0 && c._httpUrls && !this.catchUpTimer) {
      // Moves the cursor past what pushes brought (and fetches a push that was skipped).
      this.catchUpTimer = setTimeout(() => {
        this.catchUpTimer = null;
        if (c.state === "online") this.sync().catch((err) => c.emit("error", err));
      }, this.catchUpSyncMs);
    }
  }

  /** A message told before (or older than the cursor: `had`) came again: what changed, if anything. */
  _changed(m, had) {
    const c = this.client;
    const before = this.told.get(m.mid);
    const now = stateOf(m);
    // Not told here (forgotten, or before this client started): only the node's changes count.
    if (before ? same(before, now) : !had) return;
    this._remember(m.mid, now);
    const conv = convOf(m, c.user);
    if (m.recalled) {
      // Recalled while we were away.
      if (!(before && before.recalled)) c.emit("recalled", { op: "recalled", mid: m.mid, conv, by: m.from });
    } else if (now.edited > (before ? before.edited : 0)) {
      // Edited while we were away: its new body.
      c.emit("edited", { op: "edited", mid: m.mid, conv, body: m.body, edited: m.edited });
    }
    c.emit("changed", m);
  }

  queueAck(mid) {
    this.acks.add(mid);
    if (!this.ackTimer) {
      this.ackTimer = setTimeout(() => {
        this.ackTimer = null;
        this.flushAcks();
      }, this.recvAckDelayMs);
    }
  }

  /** recv_ack what came in (kept while offline: sent at the next connection). */
  flushAcks() {
    const c = this.client;
    if (!c._isOpen || this.acks.size === 0) return;
    clearTimeout(this.ackTimer);
    this.ackTimer = null;
    const mids = [...this.acks];
    this.acks.clear();
    for (let i = 0; i < mids.length; i += RECV_ACK_MAX) {
      c._sendFrame({ op: "recv_ack", mids: mids.slice(i, i + RECV_ACK_MAX) });
    }
  }

  stop() {
    clearTimeout(this.ackTimer);
    clearTimeout(this.catchUpTimer);
    this.ackTimer = this.catchUpTimer = null;
  }

  /** Pages GET /v1/sync from lastMid until done. One pass at a time: a call made
   * during one gets a fresh pass after it, whatever its outcome (it may have been
   * against a node that just died); calls waiting share that pass. */
  sync() {
    if (this.syncNext) return this.syncNext;
    if (!this.syncing) return this._run();
    const next = this.syncing.catch(() => {}).then(() => {
      this.syncNext = null;
      if (this.client._stopped) throw new ImError("stopped", "client is stopped");
      return this._run();
    });
    this.syncNext = next;
    return next;
  }

  _run() {
    const p = this._pass().finally(() => {
      if (this.syncing === p) this.syncing = null;
    });
    this.syncing = p;
    return p;
  }

  async _pass() {
    const c = this.client;
    for (;;) {
      const since = c.lastMid;
      // changes=1: also the messages already had that changed after `since` ("changed").
      const page = await c.http("GET", `/v1/sync?since=${since}&limit=${this.syncPageSize}&changes=1`);
      for (const m of page.msgs || []) this.incoming(m, false, since);
      if (typeof page.next === "number" && page.next > c.lastMid) {
        c.lastMid = page.next;
        c.emit("cursor", c.lastMid);
      }
      if (!page.more || !(page.next > since)) return;
    }
  }
}

/** The conversation of message `m` as `me` names it: the peer, or `g:GROUP`. */
function convOf(m, me) {
  if (m.group) return `g:${m.group}`;
  if (m.conv) return m.conv;
  return m.from === me ? m.to : m.from;
}

/** What a change can be: the edit time, the tombstone, the counts. */
function stateOf(m) {
  return { edited: typeof m.edited === "number" ? m.edited : 0, recalled: Boolean(m.recalled), reactions: { ...(m.reactions || {}) } };
}

function same(a, b) {
  if (a.recalled || b.recalled) return a.recalled === b.recalled; // a tombstone is all there is
  if (a.edited !== b.edited) return false;
  const ka = Object.keys(a.reactions).filter((k) => a.reactions[k] > 0);
  const kb = Object.keys(b.reactions).filter((k) => b.reactions[k] > 0);
  return ka.length === kb.length && ka.every((k) => a.reactions[k] === b.reactions[k]);
}
