// What comes in of 1:1 and group messages: dedup by mid (pushes and sync
// pages alike), batched recv_ack, and the sync of GET /v1/sync.

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
    this.recalled = new BoundedSet(dedupMax);
    this.editedAt = new Map(); // mid -> the latest `edited` (unix ms) told for it
    this.edits = new BoundedSet(dedupMax, (mid) => this.editedAt.delete(mid)); // bounds editedAt
    this.acks = new Set();
    this.ackTimer = null;
    this.catchUpTimer = null;
    this.syncing = null; // the pass running
    this.syncNext = null; // the pass queued behind it
  }

  /** A message this client sent (its ack): never shown as "message". */
  markOwn(mid) {
    this.seen.add(mid);
  }

  markRecalled(mid) {
    this.recalled.add(mid);
  }

  /** An edit of `mid` made at `at` (unix ms) is being told: false if it (or a later one) was already. */
  markEdited(mid, at) {
    if (typeof at !== "number") return true;
    const known = this.editedAt.get(mid);
    if (known !== undefined && known >= at) return false;
    this.edits.add(mid);
    this.editedAt.set(mid, at);
    return true;
  }

  /** A `msg` / `group_msg` from a push or a sync page: "message" once per mid. */
  incoming(m, pushed) {
    if (!m || typeof m.mid !== "number") return;
    const c = this.client;
    this.queueAck(m.mid);
    if (m.recalled) {
      if (this.seen.has(m.mid)) {
        // Recalled while we were away: the tombstone of a message already shown.
        if (this.recalled.add(m.mid)) c.emit("recalled", { op: "recalled", mid: m.mid, conv: m.conv, by: m.from });
        return;
      }
      this.recalled.add(m.mid);
    }
    if (!this.seen.add(m.mid)) {
      // Edited while we were away: the new body of a message already shown.
      if (typeof m.edited === "number" && !this.recalled.has(m.mid) && this.markEdited(m.mid, m.edited)) {
        c.emit("edited", { op: "edited", mid: m.mid, conv: convOf(m, c.user), body: m.body, edited: m.edited });
      }
      return;
    }
    if (typeof m.edited === "number") this.markEdited(m.mid, m.edited);
    c.emit("message", m);
    if (pushed && this.catchUpSyncMs > 0 && c._httpUrls && !this.catchUpTimer) {
      // Moves the cursor past what pushes brought (and fetches a push that was skipped).
      this.catchUpTimer = setTimeout(() => {
        this.catchUpTimer = null;
        if (c.state === "online") this.sync().catch((err) => c.emit("error", err));
      }, this.catchUpSyncMs);
    }
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
      const page = await c.http("GET", `/v1/sync?since=${since}&limit=${this.syncPageSize}`);
      for (const m of page.msgs || []) this.incoming(m, false);
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
