// Gaps in a room's positions, without servers (a scripted fake node): a jump in
// pos is recovered with a join `since` the last contiguous position and filled
// in order; what cannot be recovered is a "room_gap" event before the messages
// after it; room_gap frames; dedup; one recovery in flight; the rate limit and
// the off switch.

import assert from "node:assert/strict";
import { test } from "node:test";
import { ImClient } from "../src/imgate.js";
import { missingRanges } from "../src/rooms.js";
import { token } from "./nodes.mjs";

/**
 * A fake node: every `join` is recorded in `joins` and answered by `answer(frame)`
 * when `release()` is called (or at once with `auto`); `push(frame)` sends a push.
 */
function fakeNode() {
  const node = { joins: [], pending: [], auto: false, sockets: [], answer: null };
  class FakeWebSocket {
    constructor(url) {
      this.url = url;
      this.closed = false;
      node.sockets.push(this);
      setTimeout(() => this.onopen?.({}), 1);
    }
    send(data) {
      const f = JSON.parse(data);
      if (f.op !== "join") return;
      node.joins.push(f);
      const reply = () => this.push({ re: f.id, ...node.answer(f) });
      if (node.auto) setTimeout(reply, 1);
      else node.pending.push(reply);
    }
    push(frame) {
      if (!this.closed) this.onmessage?.({ data: JSON.stringify(frame) });
    }
    close() {
      this.closed = true;
    }
  }
  node.WebSocket = FakeWebSocket;
  node.release = () => {
    for (const r of node.pending.splice(0)) r();
  };
  node.push = (f) => node.sockets.at(-1).push(f);
  return node;
}

const rm = (...ps) => ({ op: "room_msgs", room: "r", epoch: "e1", msgs: ps.map((pos) => ({ from: "a", body: pos, pos })) });
const gapFrame = (after) => ({ op: "room_gap", room: "r", epoch: "e1", after });
const joined = (pos, msgs = [], extra = {}) => ({ op: "joined", room: "r", online: 1, users: 1, epoch: "e1", pos, msgs: msgs.map((p) => ({ from: "a", body: p, pos: p })), ...extra });
const tick = () => new Promise((r) => setTimeout(r, 5));

/** A client in room "r" at position 3, and what it emits: [pos...] for "room", ["gap", after, missing, reason]. */
async function member(opts = {}) {
  const node = fakeNode();
  const c = new ImClient({ url: "ws://n/ws", token: token("alice"), WebSocket: node.WebSocket, pingIntervalMs: 0, ...opts });
  const seen = [];
  const gaps = [];
  c.on("room", (e) => seen.push(...e.msgs.map((m) => m.pos)));
  c.on("room_gap", (g) => {
    gaps.push(g);
    seen.push(["gap", g.after, g.missing, g.reason]);
  });
  await c.connect();
  node.answer = () => joined(3);
  const j = c.join("r", opts.join);
  node.release();
  await j;
  node.joins.length = 0;
  return { node, c, seen, gaps };
}

test("missingRanges: the holes of a range", () => {
  assert.deepEqual(missingRanges(6, 20, new Set([15, 16, 17, 18, 19, 20])), [[6, 14]]);
  assert.deepEqual(missingRanges(1, 5, new Set([3])), [[1, 2], [4, 5]]);
  assert.deepEqual(missingRanges(1, 2, new Set([1, 2])), []);
});

test("a contiguous stream goes straight through, with no join", async () => {
  const { node, c, seen } = await member();
  node.push(rm(4, 5));
  node.push(rm(6));
  assert.deepEqual(seen, [4, 5, 6]);
  assert.equal(node.joins.length, 0);
  assert.deepEqual(c.roomPosition("r"), { epoch: "e1", pos: 6 });
  c.close();
});

test("a jump rejoins since the last contiguous position; the hole is filled in order", async () => {
  const { node, c, seen } = await member();
  node.push(rm(4, 7, 8));
  assert.deepEqual(seen, [4]); // after the hole: waits
  assert.deepEqual(node.joins.map((f) => f.since), [{ epoch: "e1", pos: 4 }]);
  node.push(rm(9, 11)); // meanwhile: waits, and no second recovery
  assert.equal(node.joins.length, 1);
  node.answer = () => joined(11, [5, 6, 7, 8, 9, 10, 11], { recovered: true });
  node.release();
  await tick();
  assert.deepEqual(seen, [4, 5, 6, 7, 8, 9, 10, 11]);
  node.push(rm(11, 12));
  assert.deepEqual(seen, [4, 5, 6, 7, 8, 9, 10, 11, 12]);
  c.close();
});

test("recovered: false is a room_gap event before what follows the hole", async () => {
  const { node, c, seen, gaps } = await member();
  node.push(rm(4, 20));
  node.answer = () => joined(20, [15, 16, 17, 18, 19, 20], { recovered: false });
  node.release();
  await tick();
  assert.deepEqual(seen, [4, ["gap", 4, [[5, 14]], "not_kept"], 15, 16, 17, 18, 19, 20]);
  assert.deepEqual(gaps[0], { room: "r", epoch: "e1", after: 4, missing: [[5, 14]], recovered: [15, 16, 17, 18, 19, 20], reason: "not_kept" });
  c.close();
});

test("a room_gap frame is recovered from `after`, even with recovery off", async () => {
  const { node, c, seen } = await member({ roomRecoverJumps: false });
  node.push(rm(4, 5));
  node.push(gapFrame(5));
  assert.deepEqual(node.joins.map((f) => f.since), [{ epoch: "e1", pos: 5 }]);
  node.push(rm(9, 10)); // what follows the hole waits
  assert.deepEqual(seen, [4, 5]);
  node.answer = () => joined(10, [8, 9, 10], { recovered: false });
  node.release();
  await tick();
  assert.deepEqual(seen, [4, 5, ["gap", 5, [[6, 7]], "not_kept"], 8, 9, 10]);
  c.close();
});

test("a room_gap during a recovery: recovered again from the lowest missing position once the answer is in", async () => {
  const { node, c, seen } = await member();
  node.push(rm(6));
  node.push(gapFrame(8));
  assert.equal(node.joins.length, 1);
  node.answer = () => joined(8, [4, 5, 6, 7, 8], { recovered: true });
  node.release();
  await tick();
  assert.deepEqual(node.joins.map((f) => f.since), [{ epoch: "e1", pos: 3 }, { epoch: "e1", pos: 8 }]);
  node.answer = () => joined(10, [9, 10], { recovered: true });
  node.release();
  await tick();
  assert.deepEqual(seen, [4, 5, 6, 7, 8, 9, 10]);
  c.close();
});

test("each position is emitted once", async () => {
  const { node, c, seen } = await member();
  node.push(rm(2, 3, 4));
  node.push(rm(4, 5));
  node.push(rm(5, 8));
  node.push(rm(7, 8)); // part of the hole, late, while recovering
  node.answer = () => joined(8, [5, 6, 7, 8], { recovered: true });
  node.release();
  await tick();
  node.push(rm(6, 8, 9));
  assert.deepEqual(seen, [4, 5, 6, 7, 8, 9]);
  c.close();
});

test("automatic recoveries are rate limited per room", async () => {
  const { node, c, seen } = await member({ roomRecoverIntervalMs: 60000 });
  node.push(rm(5));
  node.answer = () => joined(5, [4, 5], { recovered: true });
  node.release();
  await tick();
  node.push(rm(7)); // a second jump within the interval: told and emitted, no join
  assert.equal(node.joins.length, 1);
  assert.deepEqual(seen, [4, 5, ["gap", 5, [[6, 6]], "rate_limited"], 7]);
  node.push(gapFrame(7)); // room_gap: always acted on
  assert.equal(node.joins.length, 2);
  c.close();
});

test("the off switch: per client, and per room", async () => {
  const { node, c, seen } = await member({ roomRecoverJumps: false });
  node.push(rm(4, 6, 9));
  assert.equal(node.joins.length, 0);
  assert.deepEqual(seen, [4, ["gap", 4, [[5, 5]], "off"], 6, ["gap", 6, [[7, 8]], "off"], 9]);
  c.setRoomRecoverJumps("r", true);
  node.push(rm(11));
  assert.equal(node.joins.length, 1);
  c.close();
  const per = await member({ join: { recoverJumps: false } });
  per.node.push(rm(5));
  assert.equal(per.node.joins.length, 0);
  assert.deepEqual(per.seen, [["gap", 3, [[4, 4]], "off"], 5]);
  per.c.close();
});

test("a refused recovery emits what waited after a failed gap", async () => {
  const { node, c, seen } = await member();
  const errors = [];
  c.on("error", (e) => errors.push(e));
  node.push(rm(6, 7));
  node.answer = () => ({ op: "error", code: "unavailable", message: "redis" });
  node.release();
  await tick();
  assert.deepEqual(seen, [["gap", 3, [[4, 5]], "failed"], 6, 7]);
  assert.equal(errors[0].code, "unavailable");
  c.close();
});
