// Room gaps against real nodes: node A's link to RabbitMQ goes through a TCP
// proxy (node's net module) that the test cuts mid-stream while a publisher on
// node B sends numbered room messages. The member on A sees every message in
// position order exactly once, or a "room_gap" event covering what it did not
// see before the messages after it: never a silent jump. With a tiny history
// (IM_ROOM_HISTORY=3) node A cannot give the missed messages back and sends
// room_gap: the client rejoins `since` and tells what is gone.

import assert from "node:assert/strict";
import net from "node:net";
import { after, describe, test } from "node:test";
import { dropNamespace, newNamespace, serverUrls, settle, startNode } from "./nodes.mjs";
import { clients, uid, until, waitEvent } from "./helpers.mjs";

const T = { timeout: 90000 };

/** A TCP proxy on 127.0.0.1 in front of `port`: `cut()` resets every connection and refuses new ones until `restore()`. */
async function tcpProxy(targetPort, targetHost = "127.0.0.1") {
  const pairs = new Set();
  let isCut = false;
  const server = net.createServer((client) => {
    if (isCut) {
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(targetPort, targetHost);
    const pair = { client, upstream };
    pairs.add(pair);
    const drop = () => {
      pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", drop).on("close", drop);
    upstream.on("error", drop).on("close", drop);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise((res) => server.listen(0, "127.0.0.1", res));
  return {
    port: server.address().port,
    cut() {
      isCut = true;
      for (const { client, upstream } of pairs) {
        client.resetAndDestroy();
        upstream.resetAndDestroy();
      }
      pairs.clear();
    },
    restore() {
      isCut = false;
    },
    close() {
      this.cut();
      return new Promise((res) => server.close(() => res()));
    },
  };
}

/** The environment's RabbitMQ URL (the first of a list), by way of 127.0.0.1:`port`. */
function amqpThrough(port) {
  const u = new URL(serverUrls().amqpUrl.split(",")[0].trim());
  u.hostname = "127.0.0.1";
  u.port = String(port);
  return u.toString();
}

/** What the member saw of `room`: ["msg", pos, body] and ["gap", missing, reason], in order. */
function watch(c, room) {
  const stream = [];
  c.on("room", (e) => e.room === room && stream.push(...e.msgs.map((m) => ["msg", m.pos, m.body])));
  c.on("room_gap", (g) => g.room === room && stream.push(["gap", g.missing, g.reason]));
  return stream;
}

/** Every position first..last shown once in order, or told missing before the message after it. */
function checkNoSilentJump(stream, first, last) {
  const shown = [];
  const told = new Set();
  let prev = first - 1;
  for (const [kind, a, b] of stream) {
    if (kind === "gap") {
      for (const [lo, hi] of a) {
        assert.ok(lo > prev, `a gap about what was shown: ${JSON.stringify(stream)}`);
        for (let p = lo; p <= hi; p++) told.add(p);
      }
      continue;
    }
    assert.ok(a > prev, `pos ${a} after ${prev}: out of order or twice: ${JSON.stringify(stream)}`);
    for (let p = prev + 1; p < a; p++) assert.ok(told.has(p), `silent jump ${prev} -> ${a}: ${JSON.stringify(stream)}`);
    assert.equal(b, a - first, "the right message at its position");
    shown.push(a);
    prev = a;
  }
  assert.equal(prev, last, JSON.stringify(stream));
  return { shown, told };
}

const seenPos = (stream, pos) => stream.some(([k, p]) => k === "msg" && p === pos);

describe("imgate-client room gaps when a node's broker link is cut", () => {
  const ns = newNamespace();
  const pool = clients();
  const nodes = [];
  const proxies = [];

  after(async () => {
    pool.closeAll();
    await Promise.all(nodes.map((n) => n.stop()));
    await Promise.all(proxies.map((p) => p.close()));
    await dropNamespace(ns);
  });

  async function pair(extraEnv = {}) {
    const amqp = await tcpProxy(new URL(serverUrls().amqpUrl.split(",")[0].trim()).port || 5672);
    proxies.push(amqp);
    const env = { IM_ROOM_RATE_CAP: "0", ...extraEnv };
    const [A, B] = await Promise.all([
      startNode({ namespace: ns, env: { ...env, IM_AMQP_URL: amqpThrough(amqp.port) } }),
      startNode({ namespace: ns, env }),
    ]);
    nodes.push(A, B);
    await settle([A, B]);
    const room = uid("room");
    const member = pool.make(uid("m"), A);
    const sender = pool.make(uid("s"), B);
    await Promise.all([member.connect(), sender.connect()]);
    const stream = watch(member, room);
    const j = await member.join(room);
    await sender.join(room);
    return { amqp, room, member, sender, stream, first: (j.pos ?? 0) + 1 };
  }

  test("cut mid-stream: every message once in pos order, or told", T, async () => {
    const { amqp, room, member, sender, stream, first } = await pair();
    let sent = 0;
    for (; sent < 60; sent++) {
      if (sent === 15) amqp.cut(); // the member's node hears nothing from the broker
      if (sent === 35) amqp.restore();
      await sender.roomSend(room, sent);
      await new Promise((r) => setTimeout(r, 20));
    }
    const last = first + sent - 1;
    await until(member, "room", () => seenPos(stream, last), 45000);
    const { shown, told } = checkNoSilentJump(stream, first, last);
    assert.equal(shown.length + told.size, 60);
  });

  test("room_gap from a node with a tiny history: recovered from `after`, the rest told", T, async () => {
    const { amqp, room, member, sender, stream, first } = await pair({ IM_ROOM_HISTORY: "3" });
    let sent = 0;
    for (; sent < 2; sent++) await sender.roomSend(room, sent);
    await until(member, "room", () => seenPos(stream, first + 1));
    const gapEvent = waitEvent(member, "room_gap", (g) => g.room === room, 45000);
    amqp.cut();
    for (; sent < 12; sent++) await sender.roomSend(room, sent);
    amqp.restore();
    // Until the member's node is back on the broker: one more message at a time.
    const deadline = Date.now() + 45000;
    for (;;) {
      await sender.roomSend(room, sent++);
      const pos = first + sent - 1;
      const got = await until(member, "room", () => seenPos(stream, pos), 1000).then(() => true, () => false);
      if (got) break;
      assert.ok(Date.now() < deadline, `the member never got pos ${pos}: ${JSON.stringify(stream)}`);
    }
    const gap = await gapEvent;
    assert.equal(gap.reason, "not_kept");
    const last = first + sent - 1;
    const { shown, told } = checkNoSilentJump(stream, first, last);
    assert.ok(told.size > 0 && Math.min(...told) === first + 2, JSON.stringify(stream));
    assert.deepEqual(shown.slice(0, 2), [first, first + 1]);
    assert.equal(shown.length + told.size, last - first + 1);
  });
});
