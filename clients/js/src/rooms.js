// Live rooms of one ImClient: which rooms it is in, each room's epoch and
// positions, dedup by position, the rejoin after a reconnect, and gap recovery
// (docs/protocol.md, "Live rooms v2", "Room delivery under faults", "Client
// recipe: reconnecting to a room").
//
// Gaps: `top` is the last contiguous position. A `room_msgs` whose next new
// position is above top + 1 (same epoch) is a jump: the messages before it are
// emitted, the rest wait while a `join` with `since: {epoch, pos: top}` recovers
// the hole (one in flight per room; pushes that come meanwhile wait too). The
// reply's msgs fill the hole and what waited follows, in position order, each
// position once; what could not be recovered is a "room_gap" event emitted before
// the messages after it. A `room_gap` frame starts the same recovery, always.
// Automatic jump recovery can be turned off (client option `roomRecoverJumps`,
// per room `join(room, {recoverJumps})`) and runs at most once per
// `roomRecoverIntervalMs` per room: a jump not recovered is a "room_gap" event
// (reason "off" / "rate_limited") and its messages are emitted at once.

import { BoundedSet, ImError } from "./util.js";

const MAX_HISTORY = 100; // the most a join may ask for (gateway/protocol.py)

function isPos(p) {
  return typeof p === "number" && Number.isInteger(p);
}

/** Inclusive [first, last] ranges of first..last not in `have` (a Set). */
export function missingRanges(first, last, have) {
  const out = [];
  let start = first;
  for (const p of [...have].filter((x) => x >= first && x <= last).sort((a, b) => a - b)) {
    if (p > start) out.push([start, p - 1]);
    start = p + 1;
  }
  if (start <= last) out.push([start, last]);
  return out;
}

/**
 * Per room: `epoch` (undefined: not known yet; null: the room has none), `floor`
 * (positions at or below it are never shown: before our join, or forgotten by the
 * bounded set), `top` (the highest position accounted for: what `since` carries),
 * `seen` (positions shown, bounded), `known` (a `joined` was received),
 * `historyOff` (the node keeps no positions), `waiters` (join() calls to answer).
 */
export class RoomState {
  constructor(history, seenMax, { room = "", recoverJumps = true, recoverIntervalMs = 2000 } = {}) {
    this.room = room;
    this.history = history;
    this.epoch = undefined;
    this.floor = 0;
    this.top = 0;
    this.seen = new BoundedSet(seenMax, (pos) => {
      if (pos > this.floor) this.floor = pos;
    });
    this.known = false;
    this.historyOff = false;
    this.waiters = [];
    // Gap recovery: frames waiting for a join's reply (null: none in flight), the
    // switch, the rate limit, and the reason a failed recovery leaves for the next jump.
    this.held = null;
    this.recovering = false;
    this.recoverJumps = recoverJumps;
    this.recoverIntervalMs = recoverIntervalMs;
    this.lastAuto = null;
    this.tellNext = null;
  }

  _gap(after, missing, recovered, reason, epoch = this.epoch) {
    return { gap: true, room: this.room, epoch: epoch ?? null, after, missing, recovered, reason };
  }

  _jumpPolicy(now) {
    if (this.tellNext) return this.tellNext;
    if (!this.recoverJumps) return "off";
    if (this.lastAuto !== null && now - this.lastAuto < this.recoverIntervalMs) return "rate_limited";
    return null;
  }

  _startRecovery(out, epoch) {
    this.recovering = true;
    this.held = [];
    const e = this.epoch ?? epoch;
    out.recover = typeof e === "string"
      ? { op: "join", room: this.room, since: { epoch: e, pos: this.epoch != null ? this.top : 0 } }
      : { op: "join", room: this.room, history: MAX_HISTORY };
  }

  /**
   * A `room_msgs` or `room_gap` frame at `now` (ms): `out.items` gets the messages to
   * emit and gap objects (`{gap: true, ...}`), in order; `out.recover` the join frame
   * of a recovery to send now. Pure: no I/O.
   */
  feed(f, now, out) {
    if (this.held) {
      this.held.push(f);
      return out;
    }
    if (f.op === "room_gap") {
      this._startRecovery(out, f.epoch); // always acted on
      return out;
    }
    if (!Array.isArray(f.msgs)) return out;
    if ("epoch" in f && f.epoch !== this.epoch) this.reset(f.epoch);
    for (let i = 0; i < f.msgs.length; i++) {
      const m = f.msgs[i];
      if (!m || !isPos(m.pos) || this.historyOff || this.epoch == null || !this.known) {
        if (this.accept(m)) out.items.push(m); // no positions (or before the join's reply): as they come
        continue;
      }
      if (m.pos <= this.top) continue; // shown already: the overlap at a join, or a late one
      if (m.pos > this.top + 1) {
        const reason = this._jumpPolicy(now);
        if (reason === null) {
          this.lastAuto = now;
          this._startRecovery(out, this.epoch);
          this.held.push({ ...f, msgs: f.msgs.slice(i) });
          return out;
        }
        out.items.push(this._gap(this.top, [[this.top + 1, m.pos - 1]], [], reason));
        if (m.pos - 1 > this.floor) this.floor = m.pos - 1; // told: never shown late
      }
      this.tellNext = null;
      if (this.accept(m)) out.items.push(m);
    }
    return out;
  }

  /** The recovery join failed (refused, timed out): what waited goes out after a gap. */
  recoveryFailed(now) {
    this.recovering = false;
    const held = this.held || [];
    this.held = null;
    this.tellNext = "failed";
    const out = { items: [], recover: null };
    for (const f of held) this.feed(f, now, out);
    return out;
  }

  reset(epoch) {
    this.epoch = epoch;
    this.seen.clear();
    this.floor = 0;
    this.top = 0;
  }

  /** True if `m` is to be shown (marks it seen); messages without `pos` always are. */
  accept(m) {
    if (!m || typeof m.pos !== "number") return true;
    if (m.pos <= this.floor || !this.seen.add(m.pos)) return false;
    if (m.pos > this.top) this.top = m.pos;
    return true;
  }
}

export class Rooms {
  /** @param {import("./imgate.js").ImClient} client */
  constructor(client, seenMax = 1000, { recoverJumps = true, recoverIntervalMs = 2000 } = {}) {
    this.client = client;
    this.seenMax = seenMax;
    this.recoverJumps = recoverJumps;
    this.recoverIntervalMs = recoverIntervalMs;
    /** @type {Map<string, RoomState>} */
    this.rooms = new Map();
  }

  /** Turn automatic jump recovery of a joined room on or off. */
  setRecoverJumps(room, on) {
    const st = this.rooms.get(room);
    if (st) st.recoverJumps = !!on;
  }

  /** The rooms joined (or being joined). */
  names() {
    return [...this.rooms.keys()];
  }

  /** `{epoch, pos}` of a room as the client knows it (what a rejoin's `since` carries). */
  position(room) {
    const st = this.rooms.get(room);
    if (!st || st.epoch == null) return null;
    return { epoch: st.epoch, pos: st.top };
  }

  join(room, opts = {}) {
    let st = this.rooms.get(room);
    const history = opts.history ?? (st ? st.history : 0);
    if (!st) {
      st = new RoomState(history, this.seenMax, { room, recoverJumps: this.recoverJumps, recoverIntervalMs: this.recoverIntervalMs });
      this.rooms.set(room, st);
    } else {
      st.history = history;
    }
    if (typeof opts.recoverJumps === "boolean") st.recoverJumps = opts.recoverJumps;
    return new Promise((resolve, reject) => {
      st.waiters.push({ resolve, reject });
      // Offline: the rejoin at the next connection answers it.
      if (this.client._isOpen) this._send(room, st, "join");
    });
  }

  leave(room) {
    const st = this.rooms.get(room);
    this.rooms.delete(room);
    if (st) {
      for (const w of st.waiters.splice(0)) w.reject(new ImError("left", `left ${room}`));
    }
    const left = { op: "left", room };
    if (!this.client._isOpen) return Promise.resolve(left);
    // A new connection is in no room: a leave cut short by a drop is done all the same.
    return this.client._call({ op: "leave", room }, { onLost: (entry) => entry.resolve(left) });
  }

  /** The client stopped: join() calls still waiting fail with `err`. */
  stop(err) {
    for (const st of this.rooms.values()) for (const w of st.waiters.splice(0)) w.reject(err);
  }

  /** At each (re)connection: every room again, with `since` where a position is known. */
  rejoinAll() {
    for (const [room, st] of this.rooms) this._send(room, st, st.known ? "recover" : "join");
  }

  _send(room, st, mode, gapFrame) {
    let frame;
    let fromStart = false;
    if (mode !== "join" && !st.held) st.held = []; // pushes wait for the reply (kept if already held)
    if (mode === "gap") {
      frame = gapFrame;
      fromStart = !frame.since;
    } else if (mode === "join") {
      frame = { op: "join", room };
      if (st.history) frame.history = st.history;
    } else if (st.historyOff) {
      frame = { op: "join", room };
    } else if (st.epoch == null) {
      // No message was ever seen in this room: whatever is kept is new to us.
      frame = { op: "join", room, history: MAX_HISTORY };
      fromStart = true;
    } else {
      frame = { op: "join", room, since: { epoch: st.epoch, pos: st.top } };
    }
    this.client
      ._call(frame) // cut short by a drop: "disconnected", and rejoinAll sends it again
      .then(
        (f) => this._joined(room, st, f, mode, fromStart),
        (err) => this._failed(room, st, err, mode),
      );
  }

  _joined(room, st, f, mode, fromStart) {
    if (this.rooms.get(room) !== st) return; // left meanwhile
    if (mode === "gap") st.recovering = false;
    const msgs = Array.isArray(f.msgs) ? f.msgs : [];
    const beforeEpoch = st.known ? st.epoch : undefined;
    const beforeTop = st.top;
    let accepted;
    if (!("epoch" in f)) {
      st.historyOff = true; // IM_ROOM_HISTORY=0: no positions, nothing to recover
      st.epoch = null;
      accepted = msgs;
    } else {
      st.historyOff = false;
      if (f.epoch !== st.epoch) st.reset(f.epoch);
      accepted = msgs.filter((m) => st.accept(m));
      if (typeof f.pos === "number") {
        // Everything up to the room's position is either in msgs or before us.
        if (f.pos > st.floor) st.floor = f.pos;
        if (f.pos > st.top) st.top = f.pos;
      }
    }
    st.known = true;
    const items = [];
    if (mode !== "join" && !fromStart && typeof beforeEpoch === "string") {
      const got = accepted.filter((m) => isPos(m.pos)).map((m) => m.pos);
      if (st.epoch !== beforeEpoch) {
        items.push(st._gap(beforeTop, [], got, "epoch", beforeEpoch));
      } else if (st.top > beforeTop) {
        const missing = missingRanges(beforeTop + 1, st.top, new Set(got));
        if (missing.length) items.push(st._gap(beforeTop, missing, got, "not_kept"));
      }
    }
    if (mode === "recover") {
      let recovered = false;
      if (!st.historyOff) {
        recovered = fromStart
          ? msgs.length ? msgs[0].pos === 1 : (f.pos ?? 0) === 0
          : f.recovered === true;
      }
      this.client.emit("room_recovered", { room, recovered, epoch: st.epoch, msgs: accepted, joined: f });
    } else if (mode === "gap") {
      items.push(...accepted);
    }
    const result = { ...f };
    if ("msgs" in f) result.msgs = accepted;
    for (const w of st.waiters.splice(0)) w.resolve(result);
    // What waited for the reply: after it, in order (a new epoch drops the old one's).
    let held = st.held || [];
    st.held = null;
    if (typeof beforeEpoch === "string" && st.epoch !== beforeEpoch) held = held.filter((h) => h.epoch !== beforeEpoch);
    const out = { items, recover: null };
    for (const h of held) st.feed(h, Date.now(), out);
    this._emitOut(room, st, out);
  }

  /** Emit `out.items` in order ("room" for runs of messages, "room_gap" for gaps), then recover. */
  _emitOut(room, st, out) {
    let run = [];
    const flush = () => {
      if (run.length) this.client.emit("room", { room, epoch: st.epoch ?? null, msgs: run });
      run = [];
    };
    for (const item of out.items) {
      if (item && item.gap === true) {
        flush();
        const { gap, ...ev } = item;
        this.client.emit("room_gap", ev);
      } else run.push(item);
    }
    flush();
    if (out.recover && this.rooms.get(room) === st) {
      if (this.client._isOpen) this._send(room, st, "gap", out.recover);
      else st.recovering = false; // offline: the rejoin at the next connection recovers
    }
  }

  _failed(room, st, err, mode) {
    if (mode === "gap") st.recovering = false;
    if (err && err.code === "disconnected") return; // the next connection rejoins (since top)
    if (this.rooms.get(room) !== st) return;
    if (mode === "gap") {
      err.room = room;
      this.client.emit("error", err);
      this._emitOut(room, st, st.recoveryFailed(Date.now()));
      return;
    }
    if (!st.known || mode === "recover") this.rooms.delete(room); // not a member
    const waiters = st.waiters.splice(0);
    for (const w of waiters) w.reject(err);
    if (mode === "recover" && !waiters.length) {
      err.room = room;
      this.client.emit("error", err);
    }
  }

  /** A `room_msgs` or `room_gap` push: new positions as "room" events, gaps recovered or told. */
  onRoomMsgs(f) {
    const st = this.rooms.get(f.room);
    if (!st) return;
    this._emitOut(f.room, st, st.feed(f, Date.now(), { items: [], recover: null }));
  }

  /** `{"op":"left","room","reason"}` without `re`: kicked by the server API. */
  onLeft(f) {
    const st = this.rooms.get(f.room);
    if (!st) return;
    this.rooms.delete(f.room);
    for (const w of st.waiters.splice(0)) w.reject(new ImError("left", `left ${f.room}`));
    this.client.emit("room_left", f);
  }
}
