// The client's own logic against a scripted fake node (no servers): keepalive,
// url rotation, dedup of pushes and sync pages (edits told once), recv_ack batching, room
// positions, handshake refusals seen through the HTTP API.

import assert from "node:assert/strict";
import { test } from "node:test";
import { ImClient } from "../src/imgate.js";
import { BoundedSet, backoffDelay, jwtClaims } from "../src/util.js";
import { token } from "./nodes.mjs";
import { collect, waitEvent } from "./helpers.mjs";

/** A node's answer to a ping, as a real node gives it. */
const pong = (f) => (f.op === "ping" ? { op: "pong", re: f.id } : undefined);

/**
 * A scripted node: `reply(frame, ws)` answers each client frame (by default a
 * ping, as a real node: the sync after a connect waits for that answer);
 * `opens` says whether a handshake succeeds.
 */
function fakeNode({ reply = pong, opens = () => true } = {}) {
  const sockets = [];
  class FakeWebSocket {
    constructor(url) {
      this.url = url;
      this.sent = [];
      this.closed = false;
      sockets.push(this);
      setTimeout(() => {
        if (opens(url)) this.onopen?.({});
        else this.onerror?.({}); // like Node 20: an error and no close
      }, 1);
    }
    send(data) {
      const f = JSON.parse(data);
      this.sent.push(f);
      const r = reply(f, this);
      if (r) setTimeout(() => this.push(r), 1);
    }
    push(frame) {
      if (!this.closed) this.onmessage?.({ data: JSON.stringify(frame) });
    }
    serverClose(code, reason = "") {
      this.closed = true;
      this.onclose?.({ code, reason });
    }
    close() {
      this.closed = true;
    }
  }
  return { WebSocket: FakeWebSocket, sockets };
}

function fakeFetch(pages = [], status = () => 200) {
  const calls = [];
  const fetch = async (url) => {
    calls.push(url);
    const s = status(url);
    const body = url.includes("/v1/sync") ? pages.shift() || { msgs: [], next: 0, more: false } : { users: {} };
    return { ok: s < 300, status: s, text: async () => JSON.stringify(s < 300 ? body : { error: { code: "x", message: "no" } }) };
  };
  return { fetch, calls };
}

const msg = (mid) => ({ op: "msg", mid, from: "bob", to: "alice", body: `m${mid}`, ts: 1 });

test("util: bounded set forgets the oldest; backoff stays in its range; JWT claims", () => {
  const evicted = [];
  const s = new BoundedSet(3, (v) => evicted.push(v));
  for (const v of [1, 2, 3, 2, 4, 5]) s.add(v);
  assert.deepEqual([...s.set], [3, 4, 5]);
  assert.deepEqual(evicted, [1, 2]);
  for (let a = 0; a < 20; a++) {
    const d = backoffDelay(a, { minMs: 100, maxMs: 1000 });
    assert.ok(d >= 0 && d < Math.min(1000, 100 * 2 ** a));
  }
  assert.equal(backoffDelay(3, { minMs: 100, maxMs: 1000 }, () => 0.999), 799);
  assert.equal(jwtClaims(token("zoë")).sub, "zoë");
  assert.equal(jwtClaims("nope"), null);
});

test("pushes and sync pages: one message event per mid, recv_ack batched, cursor from next", async () => {
  const node = fakeNode();
  const { fetch } = fakeFetch([
    { msgs: [msg(10), msg(11)], next: 11, more: true },
    { msgs: [msg(12)], next: 12, more: false },
  ]);
  const c = new ImClient({ url: "ws://n1/ws", httpUrl: "http://n1", token: token("alice"), WebSocket: node.WebSocket, fetch, recvAckDelayMs: 20, catchUpSyncMs: 0 });
  const got = collect(c, "message");
  const cursors = collect(c, "cursor");
  await c.connect();
  assert.deepEqual(got.map((m) => m.mid), [10, 11, 12]);
  assert.deepEqual(cursors, [11, 12]);
  const ws = node.sockets[0];
  ws.push(msg(12)); // a push of what sync brought
  ws.push(msg(13));
  ws.push(msg(13));
  assert.deepEqual(got.map((m) => m.mid), [10, 11, 12, 13]);
  await new Promise((r) => setTimeout(r, 40)); // past recvAckDelayMs
  const acks = ws.sent.filter((f) => f.op === "recv_ack");
  assert.equal(acks.length, 1);
  assert.deepEqual(acks[0].mids.sort(), [10, 11, 12, 13]);
  // A tombstone of a message already shown is a "recalled" event, once.
  const recalled = collect(c, "recalled");
  ws.push({ op: "msg", mid: 11, conv: "bob", from: "bob", to: "alice", ts: 1, recalled: true });
  ws.push({ op: "msg", mid: 11, conv: "bob", from: "bob", to: "alice", ts: 1, recalled: true });
  assert.deepEqual(recalled.map((r) => [r.mid, r.by]), [[11, "bob"]]);
  c.close();
});

test("edits: each one told once, pushed or brought by sync; reaction and conv_settings pushes as they are", async () => {
  const node = fakeNode();
  const { fetch } = fakeFetch([
    { msgs: [msg(10), { ...msg(11), body: "first", edited: 500, reactions: { "👍": 2 } }], next: 11, more: false },
    // A later sync: 10 edited (shown unedited: "edited"), 11 as already told (nothing), 12 new.
    { msgs: [{ ...msg(10), body: "new 10", edited: 700 }, { ...msg(11), body: "first", edited: 500 }, msg(12)], next: 12, more: false },
    { msgs: [{ op: "group_msg", mid: 13, seq: 1, group: "g1", from: "bob", body: "g", ts: 1, edited: 800 }], next: 13, more: false },
    { msgs: [{ op: "group_msg", mid: 13, seq: 1, group: "g1", from: "bob", body: "g2", ts: 1, edited: 950 }], next: 13, more: false },
  ]);
  const c = new ImClient({ url: "ws://n1/ws", httpUrl: "http://n1", token: token("alice"), WebSocket: node.WebSocket, fetch, catchUpSyncMs: 0 });
  const got = collect(c, "message");
  const edits = collect(c, "edited");
  await c.connect();
  assert.deepEqual(got.map((m) => [m.mid, m.edited, m.reactions]), [[10, undefined, undefined], [11, 500, { "👍": 2 }]]);
  const ws = node.sockets[0];
  ws.push({ op: "edited", mid: 11, conv: "bob", body: "first", edited: 500 }); // already in the message: not again
  ws.push({ op: "edited", mid: 10, conv: "bob", body: "new 10", edited: 700 });
  await c.sync(); // brings 10 at the same edit: not again
  assert.deepEqual(edits.map((e) => [e.mid, e.body, e.edited]), [[10, "new 10", 700]]);
  ws.push({ op: "edited", mid: 12, conv: "bob", body: "x", edited: 900 });
  ws.push({ op: "edited", mid: 12, conv: "bob", body: "older", edited: 850 }); // a late, older one
  assert.deepEqual(edits.map((e) => e.mid), [10, 12]);
  // Sync: a group message first seen edited is a "message"; then edited while away, an "edited" (conv g:GROUP).
  await c.sync();
  assert.equal(got.at(-1).mid, 13);
  await c.sync();
  assert.deepEqual(edits.at(-1), { op: "edited", mid: 13, conv: "g:g1", body: "g2", edited: 950 });
  const reactions = collect(c, "reaction");
  const settings = collect(c, "conv_settings");
  const r = { op: "reaction", mid: 10, conv: "bob", from: "bob", emoji: "👍", on: true };
  const s = { op: "conv_settings", conv: "bob", muted: true, pinned: false, archived: false };
  ws.push(r);
  ws.push(s);
  assert.deepEqual(reactions, [r]);
  assert.deepEqual(settings, [s]);
  // edit / react / send with replyTo: the frames written.
  const p1 = c.edit(10, { text: "e" });
  const p2 = c.react(10, "🎉", false);
  const p3 = c.send("bob", "re", { replyTo: 10 });
  const p4 = c.send("bob", "plain");
  await new Promise((res) => setTimeout(res, 5));
  const [fe] = ws.sent.filter((f) => f.op === "edit");
  const [fr] = ws.sent.filter((f) => f.op === "react");
  const [f3, f4] = ws.sent.filter((f) => f.op === "send");
  assert.deepEqual([fe.mid, fe.body], [10, { text: "e" }]);
  assert.deepEqual([fr.mid, fr.emoji, fr.on], [10, "🎉", false]);
  assert.equal(f3.reply_to, 10);
  assert.equal("reply_to" in f4, false);
  ws.push({ op: "ok", re: fe.id });
  ws.push({ op: "ok", re: fr.id });
  assert.equal((await p1).op, "ok");
  assert.equal((await p2).op, "ok");
  c.close();
  await Promise.allSettled([p3, p4]);
});

test("changes in sync: messages already had come back as \"changed\" when they differ from what was told, never as \"message\"", async () => {
  const node = fakeNode();
  const m = (mid, extra = {}) => ({ ...msg(mid), ...extra });
  const { fetch, calls } = fakeFetch([
    { msgs: [m(10), m(11), m(12)], next: 12, more: false },
    // since 12: positions of changes (mids up to 12 as they are now) and a new message.
    { msgs: [m(10, { reactions: { "👍": 1 } }), m(11, { body: "new", edited: 5 }), m(13)], next: 14, more: false },
    // since 14: 10 as the pushes already told it; 12 recalled; 13 again unchanged (a young message).
    { msgs: [m(10, { reactions: { "👍": 2 } }), { op: "msg", mid: 12, conv: "bob", from: "bob", to: "alice", ts: 1, recalled: true }, m(13)], next: 14, more: false },
  ]);
  const c = new ImClient({ url: "ws://n1/ws", httpUrl: "http://n1", token: token("alice"), WebSocket: node.WebSocket, fetch, catchUpSyncMs: 0 });
  const got = collect(c, "message");
  const changed = collect(c, "changed");
  const edits = collect(c, "edited");
  const recalls = collect(c, "recalled");
  await c.connect();
  await c.sync();
  assert.deepEqual(got.map((x) => x.mid), [10, 11, 12, 13]);
  assert.deepEqual(changed.map((x) => [x.mid, x.reactions, x.body]), [[10, { "👍": 1 }, "m10"], [11, undefined, "new"]]);
  assert.deepEqual(edits.map((e) => [e.mid, e.conv, e.body]), [[11, "bob", "new"]]);
  node.sockets[0].push({ op: "reaction", mid: 10, conv: "bob", from: "bob", emoji: "👍", on: true }); // told: 👍 2
  await c.sync();
  assert.deepEqual(changed.map((x) => x.mid), [10, 11, 12]);
  assert.deepEqual(recalls.map((r) => [r.mid, r.conv, r.by]), [[12, "bob", "bob"]]);
  assert.equal(got.length, 4);
  assert.deepEqual(calls.map((u) => new URL(u).searchParams.get("changes")), ["1", "1", "1"]); // asked for
  // A new client with a persisted cursor: the node's changes of older mids are "changed", not "message".
  const { fetch: fetch2 } = fakeFetch([{ msgs: [m(3, { body: "e", edited: 9 }), m(15)], next: 15, more: false }]);
  const c2 = new ImClient({ url: "ws://n1/ws", httpUrl: "http://n1", token: token("alice"), WebSocket: node.WebSocket, fetch: fetch2, catchUpSyncMs: 0, lastMid: 14 });
  const got2 = collect(c2, "message");
  const changed2 = collect(c2, "changed");
  await c2.connect();
  assert.deepEqual(got2.map((x) => x.mid), [15]);
  assert.deepEqual(changed2.map((x) => [x.mid, x.edited]), [[3, 9]]);
  c.close();
  c2.close();
});

test("the sync after a connect starts once the node answered a ping on the new connection", async () => {
  // The node reads a connection's frames only once its device is registered: a
  // message acked after that answer is pushed, one acked before is in the sync.
  let answer = null;
  const node = fakeNode({
    reply: (f, ws) => {
      if (f.op === "ping") answer = () => ws.push({ op: "pong", re: f.id });
    },
  });
  const { fetch, calls } = fakeFetch([{ msgs: [msg(10)], next: 10, more: false }]);
  const c = new ImClient({ url: "ws://n1/ws", httpUrl: "http://n1", token: token("alice"), WebSocket: node.WebSocket, fetch, catchUpSyncMs: 0, pingIntervalMs: 0 });
  const got = collect(c, "message");
  const online = c.connect();
  for (let i = 0; i < 400 && answer === null; i++) await new Promise((r) => setTimeout(r, 5));
  assert.ok(answer, "a ping on the new connection");
  await new Promise((r) => setTimeout(r, 30)); // time enough for a sync that did not wait
  assert.equal(calls.filter((u) => u.includes("/v1/sync")).length, 0);
  answer();
  await online;
  assert.equal(calls.filter((u) => u.includes("/v1/sync")).length, 1);
  assert.deepEqual(got.map((m) => m.mid), [10]);
  c.close();
});

test("keepalive: a silent link is dropped after the ping timeout and the next url is tried", async () => {
  const node = fakeNode({ reply: () => undefined }); // answers nothing, not even pong
  const c = new ImClient({ urls: ["ws://n1/ws", "ws://n2/ws"], token: token("alice"), WebSocket: node.WebSocket, pingIntervalMs: 30, pingTimeoutMs: 30, backoff: { minMs: 1, maxMs: 5 } });
  await c.connect();
  const closed = await waitEvent(c, "closed", () => true, 2000);
  assert.deepEqual(closed, { code: 4000, reason: "ping timeout" });
  assert.ok(node.sockets[0].sent.some((f) => f.op === "ping"));
  await waitEvent(c, "state", (s) => s === "online", 2000);
  assert.equal(node.sockets[1].url.split("?")[0], "ws://n2/ws");
  c.close();
});

test("pong keeps the link; a reconnect frame moves on at once; 4003 stops", async () => {
  const node = fakeNode({ reply: pong });
  const c = new ImClient({ urls: ["ws://n1/ws", "ws://n2/ws"], token: token("alice"), WebSocket: node.WebSocket, pingIntervalMs: 20, pingTimeoutMs: 50, backoff: { minMs: 60000, maxMs: 60000 } });
  await c.connect();
  await new Promise((r) => setTimeout(r, 150)); // several ping rounds
  assert.equal(node.sockets.length, 1);
  assert.ok(node.sockets[0].sent.filter((f) => f.op === "ping").length >= 2);
  node.sockets[0].push({ op: "reconnect" });
  await waitEvent(c, "state", (s) => s === "online", 1000); // no 60 s backoff
  assert.equal(c.url, "ws://n2/ws");
  const stopped = waitEvent(c, "state", (s) => s === "stopped");
  node.sockets[1].serverClose(4003, "banned");
  await stopped;
  assert.equal(node.sockets.length, 2);
  assert.equal((await c.send("bob", "x").catch((e) => e)).code, "stopped");
});

test("a refused handshake: 401 from the HTTP API gets a new token, 403 stops, a dead node backs off", async () => {
  let n = 0;
  const good = token("alice");
  const node = fakeNode({ opens: (url) => url.includes(encodeURIComponent(good)) });
  const { fetch } = fakeFetch([], (url) => (url.includes("/v1/presence") ? 401 : 200));
  const c = new ImClient({ url: "ws://n1/ws", httpUrl: "http://n1", token: token("alice", { secret: "wrong-secret-wrong-secret-wrong-secret" }), getToken: () => (n++, good), WebSocket: node.WebSocket, fetch, backoff: { minMs: 1, maxMs: 5 } });
  await c.connect();
  assert.equal(n, 1);
  c.close();

  const banned = fakeNode({ opens: () => false });
  const f403 = fakeFetch([], () => 403);
  const b = new ImClient({ url: "ws://n1/ws", httpUrl: "http://n1", token: token("alice"), WebSocket: banned.WebSocket, fetch: f403.fetch });
  assert.equal((await b.connect().catch((e) => e)).code, "forbidden");

  const dead = fakeNode({ opens: () => false });
  const fdead = { fetch: async () => { throw new Error("ECONNREFUSED"); } };
  const d = new ImClient({ urls: ["ws://n1/ws", "ws://n2/ws"], httpUrl: "http://n1", token: token("alice"), WebSocket: dead.WebSocket, fetch: fdead.fetch, backoff: { minMs: 1, maxMs: 5 } });
  d.connect().catch(() => {});
  await waitEvent(d, "state", () => dead.sockets.length >= 4, 2000);
  assert.deepEqual(dead.sockets.slice(0, 4).map((s) => s.url.split("?")[0]), ["ws://n1/ws", "ws://n2/ws", "ws://n1/ws", "ws://n2/ws"]);
  d.close();
});

test("rooms: history and live overlap deduped by pos; a new epoch starts over; rejoin sends since", async () => {
  const node = fakeNode({
    reply: (f) => f.op === "join"
      ? { op: "joined", re: f.id, room: f.room, online: 1, users: 1, epoch: "e1", pos: 3, msgs: [{ pos: 2, body: "b" }, { pos: 3, body: "c" }], ...(f.since ? { recovered: true, msgs: [] } : {}) }
      : undefined,
  });
  const c = new ImClient({ url: "ws://n1/ws", token: token("alice"), WebSocket: node.WebSocket, backoff: { minMs: 1, maxMs: 5 } });
  const rooms = collect(c, "room");
  await c.connect();
  const ws = node.sockets[0];
  const j = await c.join("r1", { history: 2 });
  assert.deepEqual(j.msgs.map((m) => m.pos), [2, 3]);
  ws.push({ op: "room_msgs", room: "r1", epoch: "e1", msgs: [{ pos: 3 }, { pos: 4 }, { pos: 5 }] });
  ws.push({ op: "room_msgs", room: "r1", epoch: "e1", msgs: [{ pos: 5 }, { pos: 6 }] });
  ws.push({ op: "room_msgs", room: "other", epoch: "e1", msgs: [{ pos: 1 }] }); // not joined
  assert.deepEqual(rooms.map((e) => e.msgs.map((m) => m.pos)), [[4, 5], [6]]);
  const recovered = waitEvent(c, "room_recovered");
  ws.serverClose(1006);
  const rr = await recovered;
  assert.equal(rr.recovered, true);
  assert.deepEqual(node.sockets[1].sent.find((f) => f.op === "join").since, { epoch: "e1", pos: 6 });
  node.sockets[1].push({ op: "room_msgs", room: "r1", epoch: "e2", msgs: [{ pos: 1 }] });
  assert.deepEqual(rooms.at(-1), { room: "r1", epoch: "e2", msgs: [{ pos: 1 }] });
  assert.deepEqual(c.roomPosition("r1"), { epoch: "e2", pos: 1 });
  c.close();
});
