// Live rooms of one ImClient: which rooms it is in, each room's epoch and
// positions, dedup by position, and the rejoin after a reconnect
// (docs/protocol.md, "Live rooms v2", "Client recipe: reconnecting to a room").

import { BoundedSet, ImError } from "./util.js";

const MAX_HISTORY = 100; // the most a join may ask for (gateway/protocol.py)

/**
 * Per room: `epoch` (undefined: not known yet; null: the room has none), `floor`
 * (positions at or below it are never shown: before our join, or forgotten by the
 * bounded set), `top` (the highest position accounted for: what `since` carries),
 * `seen` (positions shown, bounded), `known` (a `joined` was received),
 * `historyOff` (the node keeps no positions), `waiters` (join() calls to answer).
 */
class RoomState {
  constructor(history, seenMax) {
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
  constructor(client, seenMax = 1000) {
    this.client = client;
    this.seenMax = seenMax;
    /** @type {Map<string, RoomState>} */
    this.rooms = new Map();
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
      st = new RoomState(history, this.seenMax);
      this.rooms.set(room, st);
    } else {
      st.history = history;
    }
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

  _send(room, st, mode) {
    let frame;
    let fromStart = false;
    if (mode === "join") {
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
    const msgs = Array.isArray(f.msgs) ? f.msgs : [];
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
    if (mode === "recover") {
      let recovered = false;
      if (!st.historyOff) {
        recovered = fromStart
          ? msgs.length ? msgs[0].pos === 1 : (f.pos ?? 0) === 0
          : f.recovered === true;
      }
      this.client.emit("room_recovered", { room, recovered, epoch: st.epoch, msgs: accepted, joined: f });
    }
    const result = { ...f };
    if ("msgs" in f) result.msgs = accepted;
    for (const w of st.waiters.splice(0)) w.resolve(result);
  }

  _failed(room, st, err, mode) {
    if (err && err.code === "disconnected") return; // the next connection rejoins
    if (this.rooms.get(room) !== st) return;
    if (!st.known || mode === "recover") this.rooms.delete(room); // not a member
    const waiters = st.waiters.splice(0);
    for (const w of waiters) w.reject(err);
    if (mode === "recover" && !waiters.length) {
      err.room = room;
      this.client.emit("error", err);
    }
  }

  /** A `room_msgs` push: its new positions as a "room" event. */
  onRoomMsgs(f) {
    const st = this.rooms.get(f.room);
    if (!st || !Array.isArray(f.msgs)) return;
    if ("epoch" in f && f.epoch !== st.epoch) st.reset(f.epoch);
    const msgs = f.msgs.filter((m) => st.accept(m));
    if (msgs.length) this.client.emit("room", { room: f.room, epoch: f.epoch ?? null, msgs });
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
