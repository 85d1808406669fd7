// Edit, reactions, replies and conversation settings through the SDK, against
// two real gateway nodes (one namespace, dropped at the end): every device told
// (the "edited", "reaction", "conv_settings" events), an offline user seeing
// the edit and the reactions after sync, the errors the node answers.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { dropNamespace, newNamespace, settle, startNodes } from "./nodes.mjs";
import { clients, collect, recordingWebSocket, uid, until, waitEvent, within } from "./helpers.mjs";

const T = { timeout: 20000 };
// Small caps, so the tests reach them quickly.
const LIMITS = { IM_PINNED_MAX: "2", IM_REACTION_EMOJI_MAX: "3" };

describe("imgate-client: edit, reactions, replies, conversation settings", () => {
  const ns = newNamespace();
  let A, B;
  const pool = clients();

  before(async () => {
    [A, B] = await startNodes(2, { namespace: ns, env: LIMITS });
    await settle([A, B]);
  });

  after(async () => {
    pool.closeAll();
    await Promise.all([A, B].filter(Boolean).map((n) => n.stop()));
    await dropNamespace(ns);
  });

  test("edit: every device of both users gets \"edited\"; sender only, not_found, never after a recall", T, async () => {
    const [a, b] = [uid("alice"), uid("bob")];
    const alice = pool.make(a, A);
    const alicePhone = pool.make(a, B);
    const bob = pool.make(b, B);
    await Promise.all([alice.connect(), alicePhone.connect(), bob.connect()]);
    const delivered = waitEvent(bob, "message", (m) => m.body === "see you at 7");
    const ack = await alice.send(b, "see you at 7");
    await delivered;

    const seen = [alice, alicePhone, bob].map((c) => waitEvent(c, "edited", (e) => e.mid === ack.mid));
    assert.equal((await alice.edit(ack.mid, { text: "see you at 8" })).op, "ok");
    const [e1, e2, e3] = await Promise.all(seen);
    for (const e of [e1, e2]) assert.equal(e.conv, b);
    assert.equal(e3.conv, a);
    for (const e of [e1, e2, e3]) {
      assert.equal(e.op, "edited");
      assert.deepEqual(e.body, { text: "see you at 8" });
      assert.equal(typeof e.edited, "number");
      assert.equal(e.edited, e1.edited);
    }
    // Sync and history have the new body, with "edited".
    const hist = await bob.http("GET", `/v1/history/${a}`);
    const h = hist.msgs.find((m) => m.mid === ack.mid);
    assert.deepEqual(h.body, { text: "see you at 8" });
    assert.equal(h.edited, e1.edited);

    // Only the sender; a mid nobody has; no body.
    assert.equal((await bob.edit(ack.mid, "mine now").catch((x) => x)).code, "forbidden");
    assert.equal((await alice.edit(ack.mid + 12345, "x").catch((x) => x)).code, "not_found");
    assert.equal((await alice.edit(ack.mid).catch((x) => x)).name, "TypeError");
    // Recalled: no edit any more.
    await alice.recall(ack.mid);
    const refused = await alice.edit(ack.mid, "back again").catch((x) => x);
    assert.equal(refused.code, "forbidden");
    assert.equal(refused.name, "ImError");
  });

  test("edit in a group: the members online get \"edited\" with conv g:GROUP", T, async () => {
    const [a, b, c] = [uid("alice"), uid("bob"), uid("carol")];
    const alice = pool.make(a, A);
    const bob = pool.make(b, B);
    await Promise.all([alice.connect(), bob.connect()]);
    const added = waitEvent(bob, "group_event", (e) => e.event === "added");
    const { group } = await alice.http("POST", "/v1/groups", { name: "edits", members: [b, c] });
    await added;
    const got = waitEvent(bob, "message", (m) => m.op === "group_msg");
    const ack = await alice.groupSend(group, "draft");
    await got;
    const edited = waitEvent(bob, "edited", (e) => e.mid === ack.mid);
    await alice.edit(ack.mid, "final");
    const e = await edited;
    assert.equal(e.conv, `g:${group}`);
    assert.equal(e.body, "final");
    assert.equal((await bob.edit(ack.mid, "no").catch((x) => x)).code, "forbidden");
  });

  test("react: both users' devices (the reacting one too) get \"reaction\"; repeats push nothing; caps; reactionUsers pages", T, async () => {
    const [a, b, e] = [uid("alice"), uid("bob"), uid("eve")];
    const alice = pool.make(a, A);
    const alicePhone = pool.make(a, B);
    const bob = pool.make(b, B);
    const eve = pool.make(e, A);
    await Promise.all([alice.connect(), alicePhone.connect(), bob.connect(), eve.connect()]);
    const delivered = waitEvent(bob, "message", (m) => m.body === "vote");
    const ack = await alice.send(b, "vote");
    await delivered;
    const toAlice = collect(alice, "reaction");
    const toPhone = collect(alicePhone, "reaction");
    const toBob = collect(bob, "reaction");

    assert.equal((await bob.react(ack.mid, "👍")).op, "ok");
    await until(alicePhone, "reaction", () => toPhone.length === 1);
    await until(bob, "reaction", () => toBob.length === 1);
    assert.deepEqual(toPhone[0], { op: "reaction", mid: ack.mid, conv: b, from: b, emoji: "👍", on: true });
    assert.deepEqual(toBob[0], { op: "reaction", mid: ack.mid, conv: a, from: b, emoji: "👍", on: true });
    await alice.react(ack.mid, "👍", true);
    // The same state again: ok, nothing pushed (the next push seen is the 🎉).
    await bob.react(ack.mid, "👍", true);
    await bob.react(ack.mid, "🎉");
    await until(alice, "reaction", () => toAlice.length === 3);
    assert.deepEqual(toAlice.map((r) => [r.from, r.emoji, r.on]), [[b, "👍", true], [a, "👍", true], [b, "🎉", true]]);
    await until(bob, "reaction", () => toBob.length === 3);

    // Who reacted with 👍, one per page.
    const first = await alice.reactionUsers(ack.mid, "👍", { limit: 1 });
    assert.equal(first.users.length, 1);
    assert.equal(first.cursor, first.users[0]);
    const rest = await bob.reactionUsers(ack.mid, "👍", { limit: 1, cursor: first.cursor });
    assert.deepEqual([...first.users, ...rest.users].sort(), [a, b].sort());
    assert.equal(rest.cursor, null);
    assert.deepEqual(await alice.reactionUsers(ack.mid, "🎉"), { users: [b], cursor: null });

    // Off again; history counts; the emoji cap (3 here); strangers; bad input.
    await bob.react(ack.mid, "🎉", false);
    await until(alice, "reaction", () => toAlice.length === 4);
    assert.equal(toAlice[3].on, false);
    for (const x of ["a", "b"]) await bob.react(ack.mid, x);
    const full = await bob.react(ack.mid, "c").catch((x) => x);
    assert.equal(full.code, "forbidden");
    const hist = await alice.http("GET", `/v1/history/${b}`);
    assert.deepEqual(hist.msgs.find((m) => m.mid === ack.mid).reactions, { "👍": 2, a: 1, b: 1 });
    assert.equal((await eve.react(ack.mid, "👍").catch((x) => x)).code, "not_found");
    const hidden = await eve.reactionUsers(ack.mid, "👍").catch((x) => x);
    assert.equal(hidden.status, 404);
    assert.equal((await bob.react(ack.mid, "").catch((x) => x)).code, "bad_request");
    // A recalled message takes none.
    await alice.recall(ack.mid);
    assert.equal((await bob.react(ack.mid, "👍", false).catch((x) => x)).code, "forbidden");
  });

  test("react in a group: the members online are told, conv g:GROUP", T, async () => {
    const [a, b, c] = [uid("alice"), uid("bob"), uid("carol")];
    const alice = pool.make(a, A);
    const bob = pool.make(b, B);
    await Promise.all([alice.connect(), bob.connect()]);
    const added = waitEvent(bob, "group_event", (e) => e.event === "added");
    const { group } = await alice.http("POST", "/v1/groups", { name: "reacts", members: [b, c] });
    await added;
    const got = waitEvent(bob, "message", (m) => m.op === "group_msg");
    const ack = await alice.groupSend(group, "lunch?");
    await got;
    const told = waitEvent(alice, "reaction", (r) => r.mid === ack.mid);
    await bob.react(ack.mid, "+1");
    assert.deepEqual(await told, { op: "reaction", mid: ack.mid, conv: `g:${group}`, from: b, emoji: "+1", on: true });
  });

  test("offline: a user away during the send, edit and reactions gets the edited message with its counts by sync", T, async () => {
    const [a, b] = [uid("alice"), uid("bob")];
    const alice = pool.make(a, A);
    const bob = pool.make(b, B);
    await Promise.all([alice.connect(), bob.connect()]);
    const cursor = bob.lastMid; // what bob's app persisted
    bob.close();

    const ack = await alice.send(b, { text: "meet at 7" });
    const other = await alice.send(b, { text: "bring snacks" });
    await alice.edit(ack.mid, { text: "meet at 8" });
    await alice.react(ack.mid, "👍");
    await alice.react(ack.mid, "🎉");

    const back = pool.make(b, B, { lastMid: cursor });
    const got = collect(back, "message");
    const edits = collect(back, "edited");
    await back.connect(); // online: the first sync is done
    const m = got.find((x) => x.mid === ack.mid);
    assert.ok(m, "the edited message came by sync");
    assert.deepEqual(m.body, { text: "meet at 8" });
    assert.equal(typeof m.edited, "number");
    assert.deepEqual(m.reactions, { "👍": 1, "🎉": 1 });
    const o = got.find((x) => x.mid === other.mid);
    assert.deepEqual(o.body, { text: "bring snacks" });
    assert.equal(o.edited, undefined);
    assert.equal(o.reactions, undefined);
    assert.deepEqual(edits, []); // a message first seen edited is one "message", no "edited"
  });

  test("offline: a message shown before the link dropped, edited and reacted to meanwhile: one \"edited\", one \"changed\"", T, async () => {
    const [a, b] = [uid("alice"), uid("bob")];
    const rec = recordingWebSocket();
    const alice = pool.make(a, A);
    // No catch-up sync: the cursor stays before the pushed message until the next connection.
    const bob = pool.make(b, B, { WebSocket: rec.WebSocket, catchUpSyncMs: 0 });
    const got = collect(bob, "message");
    const edits = collect(bob, "edited");
    const changed = collect(bob, "changed");
    await Promise.all([alice.connect(), bob.connect()]);
    const ack = await alice.send(b, "typo");
    await until(bob, "message", () => got.some((m) => m.mid === ack.mid));
    assert.ok(bob.lastMid < ack.mid);

    rec.gate.open = false;
    const offline = waitEvent(bob, "state", (s) => s === "offline");
    rec.dropCurrent();
    await offline;
    await alice.edit(ack.mid, "fixed");
    await alice.react(ack.mid, "👀");
    const online = waitEvent(bob, "state", (s) => s === "online");
    rec.gate.open = true;
    await online;
    assert.equal(got.filter((m) => m.mid === ack.mid).length, 1); // not shown twice
    assert.equal(edits.length, 1);
    assert.equal(edits[0].mid, ack.mid);
    assert.equal(edits[0].conv, a);
    assert.equal(edits[0].body, "fixed");
    assert.equal(typeof edits[0].edited, "number");
    assert.deepEqual(changed.map((m) => [m.mid, m.body, m.reactions]), [[ack.mid, "fixed", { "👀": 1 }]]);
    // The same edit, pushed or synced again, is not told twice.
    await bob.sync();
    assert.equal(edits.length, 1);
    assert.equal(changed.length, 1);
  });

  test("offline past the cursor: edit, counts and recall of messages already synced come as \"changed\" (with \"edited\" / \"recalled\"), never as \"message\"", T, async () => {
    const [a, b] = [uid("alice"), uid("bob")];
    const alice = pool.make(a, A);
    const bob = pool.make(b, B);
    const got = collect(bob, "message");
    await Promise.all([alice.connect(), bob.connect()]);
    const acks = [];
    for (const t of ["one", "two", "three", "four"]) acks.push(await alice.send(b, t));
    const [m1, m2, m3, m4] = acks.map((x) => x.mid);
    await until(bob, "message", () => got.length === 4);
    // The cursor moves past them once they are older than IM_SYNC_SETTLE_MS (1 s).
    await within((async () => {
      while (bob.lastMid < m4) {
        await new Promise((r) => setTimeout(r, 100));
        await bob.sync();
      }
    })(), 8000, "bob's cursor past the messages");
    const cursor = bob.lastMid;
    bob.close();

    await alice.edit(m1, "one, edited");
    await alice.react(m2, "👍");
    await alice.recall(m3);
    const later = await alice.send(b, "five");

    // The app starts again from its persisted cursor.
    const back = pool.make(b, B, { lastMid: cursor });
    const msgs = collect(back, "message");
    const changed = collect(back, "changed");
    const edits = collect(back, "edited");
    const recalls = collect(back, "recalled");
    await back.connect();
    assert.deepEqual(msgs.map((m) => m.mid), [later.mid]);
    const byMid = Object.fromEntries(changed.map((m) => [m.mid, m]));
    assert.deepEqual(Object.keys(byMid).map(Number).sort(), [m1, m2, m3].sort());
    assert.equal(changed.length, 3); // each changed message once
    assert.equal(byMid[m1].body, "one, edited");
    assert.equal(typeof byMid[m1].edited, "number");
    assert.deepEqual(byMid[m2].reactions, { "👍": 1 });
    assert.equal(byMid[m3].recalled, true);
    assert.deepEqual(edits.map((e) => [e.mid, e.conv, e.body]), [[m1, a, "one, edited"]]);
    assert.deepEqual(recalls.map((r) => [r.mid, r.conv, r.by]), [[m3, a, a]]);
    // Synced again: nothing more.
    await back.sync();
    assert.equal(changed.length, 3);
    assert.equal(msgs.length, 1);
  });

  test("replyTo: send and groupSend carry reply_to to pushes, sync and history; another conversation's mid is bad_request", T, async () => {
    const [a, b, c] = [uid("alice"), uid("bob"), uid("carol")];
    const alice = pool.make(a, A);
    const bob = pool.make(b, B);
    const toAlice = collect(alice, "message");
    await Promise.all([alice.connect(), bob.connect()]);
    const toBob = collect(bob, "message");
    const question = await alice.send(b, "question?");
    const elsewhere = await alice.send(c, "other");
    await until(bob, "message", () => toBob.some((m) => m.mid === question.mid));
    const answer = await bob.send(a, "answer", { replyTo: question.mid });
    await until(alice, "message", () => toAlice.some((m) => m.mid === answer.mid));
    const pushed = toAlice.find((m) => m.mid === answer.mid);
    assert.equal(pushed.reply_to, question.mid);
    const hist = await alice.http("GET", `/v1/history/${b}`);
    assert.equal(hist.msgs.find((m) => m.mid === answer.mid).reply_to, question.mid);
    assert.equal(hist.msgs.find((m) => m.mid === question.mid).reply_to, undefined);
    const sync = await bob.http("GET", "/v1/sync?since=0");
    assert.equal(sync.msgs.find((m) => m.mid === answer.mid).reply_to, question.mid);
    const wrong = await bob.send(a, "x", { replyTo: elsewhere.mid }).catch((x) => x);
    assert.equal(wrong.code, "bad_request");
    assert.equal(typeof wrong.cmid, "string");

    const added = waitEvent(bob, "group_event", (e) => e.event === "added");
    const { group } = await alice.http("POST", "/v1/groups", { name: "replies", members: [b] });
    await added;
    const gm = await alice.groupSend(group, "in the group");
    const gotReply = waitEvent(alice, "message", (m) => m.op === "group_msg" && m.from === b);
    const re = await bob.groupSend(group, "re", { replyTo: gm.mid });
    const g = await gotReply;
    assert.equal(g.mid, re.mid);
    assert.equal(g.reply_to, gm.mid);
    assert.equal((await bob.groupSend(group, "re", { replyTo: question.mid }).catch((x) => x)).code, "bad_request");
  });

  test("setConversation: every device gets \"conv_settings\"; rows carry the flags, pinned first; the pin cap is 403", T, async () => {
    const [a, b, c, d] = [uid("alice"), uid("bob"), uid("carol"), uid("dave")];
    const alice = pool.make(a, A);
    const alicePhone = pool.make(a, B);
    await Promise.all([alice.connect(), alicePhone.connect()]);
    for (const peer of [b, c, d]) {
      const p = pool.make(peer, B);
      await p.connect();
      await p.send(a, `from ${peer}`);
      p.close();
    }
    const told = [alice, alicePhone].map((x) => waitEvent(x, "conv_settings", (s) => s.conv === b));
    const r = await alice.setConversation(b, { pinned: true });
    assert.deepEqual(r, { ok: true, conv: b, muted: false, pinned: true, archived: false });
    for (const s of await Promise.all(told)) {
      assert.deepEqual(s, { op: "conv_settings", conv: b, muted: false, pinned: true, archived: false });
    }
    // Only the keys given change.
    const muted = waitEvent(alicePhone, "conv_settings", (s) => s.conv === d && s.muted);
    assert.deepEqual(await alicePhone.setConversation(d, { muted: true, archived: undefined }),
      { ok: true, conv: d, muted: true, pinned: false, archived: false });
    await muted;
    const list = await alicePhone.http("GET", "/v1/conversations");
    assert.equal(list.conversations[0].conv, b); // the oldest, but pinned
    const rows = Object.fromEntries(list.conversations.map((x) => [x.conv, x]));
    assert.deepEqual([rows[b].pinned, rows[b].muted, rows[b].archived], [true, false, false]);
    assert.deepEqual([rows[d].pinned, rows[d].muted], [false, true]);
    assert.deepEqual([rows[c].pinned, rows[c].muted], [false, false]);
    // The cap (2 here), then unpinning makes room again.
    await alice.setConversation(c, { pinned: true });
    const over = await alice.setConversation(d, { pinned: true }).catch((x) => x);
    assert.equal(over.status, 403);
    assert.equal(over.code, "forbidden");
    await alice.setConversation(b, { pinned: false });
    assert.equal((await alice.setConversation(d, { pinned: true })).pinned, true);
    // Not a conversation of one's own.
    assert.equal((await alice.setConversation(a, { muted: true }).catch((x) => x)).status, 400);
  });
});
