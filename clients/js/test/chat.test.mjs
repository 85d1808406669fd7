// The SDK against two real gateway nodes (one namespace, dropped at the end):
// 1:1, offline sync, groups, read receipts, typing, presence, recall, rooms,
// token expiry (4001), refresh, ban (4003), refused tokens.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ImClient } from "../src/imgate.js";
import { dropNamespace, newNamespace, serverApi, settle, startNode, token } from "./nodes.mjs";
import { clients, collect, recordingWebSocket, uid, until, waitEvent, within } from "./helpers.mjs";

const T = { timeout: 20000 };

describe("imgate-client against two nodes", () => {
  const ns = newNamespace();
  let A, B, R;
  const pool = clients();

  before(async () => {
    // R: a node with a tight send budget (rate_limited comes quickly).
    const slow = { IM_SEND_RATE: "20", IM_SEND_BURST: "20" };
    [A, B, R] = await Promise.all([startNode({ namespace: ns }), startNode({ namespace: ns }), startNode({ namespace: ns, env: slow })]);
    await settle([A, B]);
  });

  after(async () => {
    pool.closeAll();
    await Promise.all([A, B, R].filter(Boolean).map((n) => n.stop()));
    await dropNamespace(ns);
  });

  test("1:1 both ways across two nodes: ack, one delivery each, no echo, resent cmid deduped", T, async () => {
    const [a, b] = [uid("alice"), uid("bob")];
    const alice = pool.make(a, A);
    const bob = pool.make(b, B);
    const toBob = collect(bob, "message");
    const toAlice = collect(alice, "message");
    await Promise.all([alice.connect(), bob.connect()]);
    assert.equal(alice.state, "online");

    const ack1 = await alice.send(b, { text: "a->b" });
    assert.equal(ack1.op, "ack");
    assert.equal(typeof ack1.mid, "number");
    assert.match(ack1.cmid, /^[A-Za-z0-9_.:-]{1,64}$/);
    await until(bob, "message", () => toBob.some((m) => m.mid === ack1.mid));
    const ack2 = await bob.send(a, { text: "b->a" });
    await until(alice, "message", () => toAlice.some((m) => m.mid === ack2.mid));

    // The same cmid again: the same mid, nothing new anywhere.
    const again = await alice.send(b, { text: "a->b" }, { cmid: ack1.cmid });
    assert.equal(again.mid, ack1.mid);
    // Sync returns what pushes brought (and each side's own message): none shown twice.
    await Promise.all([alice.sync(), bob.sync()]);
    assert.deepEqual(toBob.map((m) => m.mid), [ack1.mid]);
    assert.deepEqual(toAlice.map((m) => m.mid), [ack2.mid]);
    assert.deepEqual(toBob[0], { op: "msg", mid: ack1.mid, from: a, to: b, body: { text: "a->b" }, ts: ack1.ts });
  });

  test("offline then back: what was sent meanwhile arrives by sync, exactly once", T, async () => {
    const [a, b] = [uid("alice"), uid("bob")];
    const rec = recordingWebSocket();
    const alice = pool.make(a, A);
    const bob = pool.make(b, B, { WebSocket: rec.WebSocket });
    const got = collect(bob, "message");
    const cursors = collect(bob, "cursor");
    await Promise.all([alice.connect(), bob.connect()]);
    const cursorBefore = bob.lastMid;

    rec.gate.open = false; // bob's next connections fail until it opens
    const offline = waitEvent(bob, "state", (s) => s === "offline");
    rec.dropCurrent();
    await offline;
    const acks = [];
    for (let i = 0; i < 5; i++) acks.push(await alice.send(b, { n: i }));
    const mids = acks.map((x) => x.mid);
    assert.equal(got.length, 0);
    // At least one attempt fails against the unreachable node before it is back.
    await waitEvent(bob, "state", (s) => s === "connecting");
    await waitEvent(bob, "state", (s) => s === "offline");

    rec.gate.open = true;
    await until(bob, "message", () => mids.every((m) => got.some((g) => g.mid === m)));
    assert.equal(bob.state === "online" || bob.state === "connecting", true);
    await bob.sync(); // again: nothing new
    assert.deepEqual(got.map((m) => m.mid), mids); // oldest first, each once
    assert.ok(rec.sockets.some((s) => !s.reached), "a connection attempt was made while unreachable");
    // (The cursor does not pass messages younger than IM_SYNC_SETTLE_MS: it may not have moved yet.)
    assert.ok(bob.lastMid >= cursorBefore);
    assert.deepEqual(cursors, [...cursors].sort((x, y) => x - y));

    // A new client that persisted the cursor from before gets them too, once each.
    const bob2 = pool.make(b, A, { lastMid: cursorBefore });
    const got2 = collect(bob2, "message");
    await bob2.connect();
    const seen2 = got2.map((m) => m.mid);
    for (const m of mids) assert.equal(seen2.filter((x) => x === m).length, 1);
  });

  test("rate_limited sends are paced and written again, not failed; the connection stays up", T, async () => {
    const [s, p] = [uid("burst"), uid("peer")];
    const rec = recordingWebSocket();
    const sender = pool.make(s, R, { WebSocket: rec.WebSocket });
    const closes = collect(sender, "closed");
    await sender.connect();
    const acks = await within(Promise.all(Array.from({ length: 60 }, (_, i) => sender.send(p, { i }))), 15000, "60 sends");
    assert.equal(new Set(acks.map((a) => a.mid)).size, 60);
    assert.deepEqual(closes, []);
    assert.equal(rec.sockets.length, 1);
    const written = rec.sockets[0].sent.filter((f) => f.op === "send").length;
    assert.ok(written > 60, `some were refused and written again (${written} writes)`);
    const peer = pool.make(p, A);
    const got = collect(peer, "message");
    await peer.connect(); // its first sync pages all 60
    assert.deepEqual(got.map((m) => m.body.i).sort((x, y) => x - y), [...Array(60).keys()]);
  });

  test("group send: created over HTTP, group_event, group_msg to members, HTTP errors", T, async () => {
    const [a, b, c] = [uid("alice"), uid("bob"), uid("carol")];
    const alice = pool.make(a, A);
    const bob = pool.make(b, B);
    const carol = pool.make(c, A);
    await Promise.all([alice.connect(), bob.connect(), carol.connect()]);
    const added = waitEvent(bob, "group_event", (e) => e.event === "added");
    const { group } = await alice.http("POST", "/v1/groups", { name: "js sdk", members: [b, c] });
    const ev = await added;
    assert.equal(ev.group, group);
    assert.equal(ev.by, a);

    const toBob = waitEvent(bob, "message", (m) => m.op === "group_msg");
    const toCarol = waitEvent(carol, "message", (m) => m.op === "group_msg");
    const ack = await alice.groupSend(group, { text: "hello group" });
    assert.equal(ack.seq, 1);
    for (const m of [await toBob, await toCarol]) {
      assert.equal(m.mid, ack.mid);
      assert.equal(m.group, group);
      assert.equal(m.from, a);
      assert.deepEqual(m.body, { text: "hello group" });
    }

    const err = await alice.http("GET", "/v1/groups/nosuchgroup").catch((e) => e);
    assert.ok([403, 404].includes(err.status), `status ${err.status}`);
    assert.equal(err.code, err.status === 404 ? "not_found" : "forbidden");
    const bad = await alice.groupSend("nosuchgroup", "x").catch((e) => e);
    assert.ok(["not_found", "forbidden"].includes(bad.code), bad.code);
  });

  test("read and receipt; typing; notice; recall", T, async () => {
    const [a, b] = [uid("alice"), uid("bob")];
    const alice = pool.make(a, A);
    const bob = pool.make(b, B);
    const bobPhone = pool.make(b, A);
    await Promise.all([alice.connect(), bob.connect(), bobPhone.connect()]);

    const delivered = waitEvent(bob, "message");
    const ack = await alice.send(b, "read me");
    await delivered;
    const receipt = waitEvent(alice, "receipt", (r) => r.mid === ack.mid);
    const readSync = waitEvent(bobPhone, "read", (r) => r.mid === ack.mid);
    assert.equal((await bob.read(a, ack.mid)).op, "ok");
    assert.equal((await receipt).conv, b);
    const r = await readSync;
    assert.equal(r.conv, a);
    assert.equal(r.unread, 0);

    const typing = waitEvent(bob, "typing", (t) => t.from === a);
    alice.typing(b);
    assert.equal((await typing).conv, a);

    const notice = waitEvent(bob, "notice");
    assert.equal((await serverApi(A, "POST", "/v1/server/notify", { users: [b], body: { n: 1 } })).online, 2);
    assert.deepEqual((await notice).body, { n: 1 });

    const recalled = waitEvent(bob, "recalled", (x) => x.mid === ack.mid);
    assert.equal((await alice.recall(ack.mid)).op, "ok");
    const x = await recalled;
    assert.equal(x.conv, a);
    assert.equal(x.by, a);
  });

  test("presence: sub answers the state, then online and offline pushes across nodes", T, async () => {
    const [a, d] = [uid("alice"), uid("dave")];
    const alice = pool.make(a, A);
    await alice.connect();
    const dave = pool.make(d, B);
    // Presence is shown to contacts (the default): a stranger's is hidden.
    assert.deepEqual((await alice.presenceSub([d])).users[d], { hidden: true });
    await alice.presenceUnsub([d]);
    await dave.http("POST", `/v1/follow/${a}`); // alice is now a contact of dave's
    // The follow was made through node B: node A learns of it through the
    // broker, a moment later (docs/protocol.md: when a change is in force).
    let first = await alice.presenceSub([d]);
    for (let i = 0; i < 100 && first.users[d].hidden; i++) {
      await alice.presenceUnsub([d]);
      await new Promise((r) => setTimeout(r, 20));
      first = await alice.presenceSub([d]);
    }
    assert.equal(first.users[d].online, false);

    const online = waitEvent(alice, "presence", (p) => p.users[d] && p.users[d].online === true);
    await dave.connect();
    await online;
    const offline = waitEvent(alice, "presence", (p) => p.users[d] && p.users[d].online === false);
    dave.close();
    await offline; // after IM_PRESENCE_GRACE_S (1 s here)
    assert.equal((await alice.presenceUnsub([d])).op, "ok");
  });

  test("rooms: join with history, positions deduped, rejoin with since after a reconnect", T, async () => {
    const [a, b] = [uid("alice"), uid("bob")];
    const room = uid("room");
    const rec = recordingWebSocket();
    const alice = pool.make(a, A);
    const bob = pool.make(b, B, { WebSocket: rec.WebSocket });
    await Promise.all([alice.connect(), bob.connect()]);
    const j = await alice.join(room);
    assert.equal(j.op, "joined");
    assert.equal(j.room, room);
    for (let i = 1; i <= 3; i++) assert.equal((await alice.roomSend(room, { n: i })).op, "ok");

    const seen = []; // every pos bob was shown
    bob.on("room", (e) => seen.push(...e.msgs.map((m) => m.pos)));
    const bj = await bob.join(room, { history: 2 });
    assert.deepEqual(bj.msgs.map((m) => m.body), [{ n: 2 }, { n: 3 }]);
    seen.push(...bj.msgs.map((m) => m.pos));
    assert.equal(typeof bj.epoch, "string");

    await alice.roomSend(room, { n: 4 }, { prio: 1 });
    await until(bob, "room", () => seen.length === 3);

    // Bob's link drops; two messages go by while it cannot reconnect.
    rec.gate.open = false;
    const offline = waitEvent(bob, "state", (s) => s === "offline");
    rec.dropCurrent();
    await offline;
    await alice.roomSend(room, { n: 5 });
    await alice.roomSend(room, { n: 6 });
    const recovered = waitEvent(bob, "room_recovered", (e) => e.room === room);
    rec.gate.open = true;
    const rr = await recovered;
    assert.equal(rr.recovered, true);
    assert.deepEqual(rr.msgs.map((m) => m.body), [{ n: 5 }, { n: 6 }]);
    seen.push(...rr.msgs.map((m) => m.pos));
    const rejoin = rec.sockets.at(-1).sent.find((f) => f.op === "join");
    assert.deepEqual(rejoin.since, { epoch: bj.epoch, pos: 4 });

    await alice.roomSend(room, { n: 7 });
    await until(bob, "room", () => seen.length === 6);
    assert.deepEqual(seen, [2, 3, 4, 5, 6, 7]);
    assert.deepEqual(bob.roomPosition(room), { epoch: bj.epoch, pos: 7 });
    assert.equal((await bob.leave(room)).op, "left");
    assert.equal(bob.roomPosition(room), null);

    // Kicked by the server API: "room_left", and the room is forgotten (no rejoin).
    const kicked = waitEvent(alice, "room_left", (e) => e.room === room);
    await serverApi(A, "POST", `/v1/server/rooms/${room}/kick/${a}`);
    assert.equal((await kicked).reason, "kicked");
    assert.equal(alice.roomPosition(room), null);
  });

  test("4001: an expired token closes the socket; getToken gives a new one and the client reconnects", T, async () => {
    const e = uid("eve");
    let calls = 0;
    const eve = pool.make(e, A, {
      token: token(e, { ttlS: 2 }),
      getToken: async () => (calls++, token(e)),
      refreshAheadMs: 0, // no refresh op: let it expire
    });
    await eve.connect();
    const closed = waitEvent(eve, "closed", (c) => c.code === 4001, 8000);
    await closed;
    await waitEvent(eve, "state", (s) => s === "online");
    assert.ok(calls >= 1);
    const peer = uid("peer");
    assert.equal((await eve.send(peer, "still here")).op, "ack");
  });

  test("refresh: before exp the client sends refresh with a token from getToken; no close", T, async () => {
    const f = uid("fay");
    let calls = 0;
    let third;
    const thirdCall = new Promise((resolve) => (third = resolve));
    const fay = pool.make(f, A, {
      token: token(f, { ttlS: 2 }),
      getToken: async () => {
        if (++calls === 3) third();
        return token(f, { ttlS: 2 });
      },
    });
    const closes = collect(fay, "closed");
    await fay.connect();
    const start = Date.now();
    // ~1 s apart (half a 2 s lifetime): the first token is long expired by the third.
    await within(thirdCall, 8000, "three refreshes");
    await waitEvent(fay, "closed", () => true, 300).then(
      () => assert.fail("closed"),
      () => {},
    );
    assert.ok(Date.now() - start > 2000);
    assert.deepEqual(closes, []);
    assert.equal(fay.state, "online");
    assert.equal((await fay.send(uid("peer"), "alive")).op, "ack");
  });

  test("4005: the same device connecting again elsewhere replaces this client, which stops", T, async () => {
    const u = uid("dev");
    const first = pool.make(u, A, { device: "laptop-1", platform: "desktop" });
    await first.connect();
    const stopped = waitEvent(first, "state", (s) => s === "stopped");
    const second = pool.make(u, B, { device: "laptop-1", platform: "desktop" });
    await second.connect();
    await within(stopped, 5000, "the replaced client stopping");
    const err = await first.send("someone", "x").catch((x) => x);
    assert.equal(err.code, "stopped");
    assert.equal(second.state, "online");
  });

  test("4003: a ban closes the socket and stops the client; a banned or bad token rejects connect", T, async () => {
    const g = uid("gil");
    const gil = pool.make(g, B);
    await gil.connect();
    const states = collect(gil, "state");
    const closed = waitEvent(gil, "closed", (c) => c.code === 4003);
    await serverApi(A, "POST", `/v1/server/users/${g}/ban`, { seconds: 60 });
    await closed;
    assert.equal(gil.state, "stopped");
    assert.deepEqual(states, ["stopped"]);
    const err = await gil.send("someone", "x").catch((x) => x);
    assert.equal(err.code, "stopped");

    const again = pool.make(g, A);
    const refused = await within(again.connect().catch((x) => x), 5000, "connect of a banned user");
    assert.equal(refused.code, "forbidden");
    assert.equal(again.state, "stopped");

    const forged = new ImClient({ url: A.wsUrl, httpUrl: A.httpUrl, token: token(uid("mal"), { secret: "not-the-secret-0123456789-0123456789" }) });
    const bad = await within(forged.connect().catch((x) => x), 5000, "connect with a bad token");
    assert.equal(bad.code, "unauthorized");
    assert.equal(forged.state, "stopped");

    // Not a JWT at all (a pasted fragment): also refused and stopped, not retried in silence.
    const garbage = new ImClient({ url: A.wsUrl, httpUrl: A.httpUrl, token: "not-a-token" });
    const nope = await within(garbage.connect().catch((x) => x), 5000, "connect with a garbage token");
    assert.equal(nope.code, "unauthorized");
    assert.equal(garbage.state, "stopped");
  });
});
