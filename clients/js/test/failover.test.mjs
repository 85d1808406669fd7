// Nodes going away under a connected client: SIGKILL mid-conversation (the
// client moves to the next url, resends what was in flight with the same cmid,
// the peer gets every acked message once), and SIGTERM (the node's `reconnect`
// frame and 1001: the client moves on at once).

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { dropNamespace, newNamespace, settle, startNodes } from "./nodes.mjs";
import { clients, collect, recordingWebSocket, uid, until, waitEvent, within } from "./helpers.mjs";

const T = { timeout: 30000 };

describe("imgate-client when nodes go away", () => {
  const ns = newNamespace();
  let A, B, C;
  const pool = clients();

  before(async () => {
    [A, B, C] = await startNodes(3, { namespace: ns });
    await settle([A, B, C]);
  });

  after(async () => {
    pool.closeAll();
    await Promise.all([A, B, C].filter(Boolean).map((n) => n.stop()));
    await dropNamespace(ns);
  });

  test("SIGKILL of the client's node mid-conversation: moves on, resends in flight, nothing lost or doubled", T, async () => {
    const [s, p] = [uid("sender"), uid("peer")];
    const rec = recordingWebSocket();
    const sender = pool.make(s, [A, B], { WebSocket: rec.WebSocket });
    const peer = pool.make(p, B);
    const got = collect(peer, "message");
    const closes = collect(sender, "closed");
    await Promise.all([sender.connect(), peer.connect()]);
    assert.equal(sender.url, A.wsUrl);

    const acks = [];
    for (let i = 0; i < 10; i++) acks.push(await sender.send(p, { i }));
    // A burst on the wire, and the node dies before it can answer all of it.
    const burst = [];
    for (let i = 10; i < 20; i++) burst.push(sender.send(p, { i }));
    const killed = A.kill("SIGKILL");
    // More while the client is moving: queued, written on the next connection.
    await waitEvent(sender, "state", (st) => st !== "online");
    for (let i = 20; i < 25; i++) burst.push(sender.send(p, { i }));
    acks.push(...(await within(Promise.all(burst), 20000, "acks of the burst")));
    await killed;

    assert.equal(sender.url, B.wsUrl);
    assert.equal(sender.state, "online");
    assert.ok(closes.length >= 1);
    const mids = acks.map((a) => a.mid);
    assert.equal(new Set(mids).size, 25, "25 distinct mids");

    // What was written on A and not answered there was written again on B, same cmid, once.
    const [onA, ...later] = rec.sockets;
    const cmidsOn = (sock) => sock.sent.filter((f) => f.op === "send").map((f) => f.cmid);
    const sentA = cmidsOn(onA);
    const sentLater = later.flatMap(cmidsOn);
    const resent = sentA.filter((c) => sentLater.includes(c));
    assert.ok(resent.length >= 1, `a send in flight at the kill was resent (on A: ${sentA.length})`);
    assert.equal(new Set(sentLater).size, sentLater.length, "each cmid written at most once per connection");
    for (const c of resent) assert.ok(acks.some((a) => a.cmid === c), `resent ${c} was acked`);

    // The peer (never disconnected) gets every acked message exactly once; sync
    // brings any whose push died with the node.
    await peer.sync();
    await until(peer, "message", () => mids.every((m) => got.some((g) => g.mid === m)), 10000);
    await peer.sync();
    const counts = new Map();
    for (const m of got) counts.set(m.mid, (counts.get(m.mid) || 0) + 1);
    for (const m of mids) assert.equal(counts.get(m), 1, `mid ${m} delivered once`);
    assert.deepEqual(got.map((m) => m.body.i).sort((x, y) => x - y), [...Array(25).keys()]);
  });

  test("SIGTERM (drain): the reconnect frame moves the client to the next url at once", T, async () => {
    const [d, p] = [uid("dora"), uid("peer")];
    const dora = pool.make(d, [B, C], { backoff: { minMs: 5000, maxMs: 5000 } }); // a backoff would show
    const peer = pool.make(p, C);
    const got = collect(peer, "message");
    await Promise.all([dora.connect(), peer.connect()]);
    assert.equal(dora.url, B.wsUrl);

    const moved = waitEvent(dora, "closed", (c) => c.code === 1001);
    const started = Date.now();
    const stopped = B.stop();
    await moved;
    await waitEvent(dora, "state", (st) => st === "online", 5000);
    assert.ok(Date.now() - started < 4000, "no backoff before the next node");
    assert.equal(dora.url, C.wsUrl);
    const ack = await dora.send(p, "from the next node");
    await until(peer, "message", () => got.some((m) => m.mid === ack.mid));
    await stopped;
  });
});
