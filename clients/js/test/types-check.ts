// Compiled, never run (npm run typecheck): the declarations as the demo uses them.
import { ImClient, ImError } from "../src/imgate.js";
import type {
  AckFrame, ChatMessage, ConvSettingsResult, EditedFrame, JoinedFrame, ReactionFrame, ReactionUsersPage, RoomGapEvent,
  RoomRecoveredEvent,
} from "../src/imgate.js";

async function demo(): Promise<void> {
  const c = new ImClient({
    urls: ["ws://127.0.0.1:8080/ws", "ws://127.0.0.1:8090/ws"],
    httpUrls: ["http://127.0.0.1:8081", "http://127.0.0.1:8091"],
    getToken: async () => "JWT",
    backoff: { minMs: 200, maxMs: 10000 },
    recvAckDelayMs: 100,
    lastMid: Number("0"),
  });
  c.on("state", (s) => {
    const ok: "connecting" | "online" | "offline" | "stopped" = s;
    void ok;
  });
  c.on("message", (m: ChatMessage) => {
    if (m.op === "group_msg") console.log(m.group, m.seq, m.body);
    else console.log(m.from, m.to, m.body);
  });
  c.on("cursor", (mid) => localStorage_set("lastMid", String(mid + 0)));
  c.on("room", (e) => e.msgs.forEach((m) => console.log(e.room, m.pos, m.body)));
  c.on("room_recovered", (e: RoomRecoveredEvent) => console.log(e.recovered, e.msgs.length));
  c.on("room_gap", (g: RoomGapEvent) => g.missing.forEach(([a, b]) => console.log(g.room, g.after, a, b, g.reason)));
  c.on("closed", ({ code, reason }) => console.log(code, reason));
  c.on("error", (err) => console.log(err.code, err.message));
  c.on("presence", (p) => Object.entries(p.users).forEach(([u, s]) => console.log(u, s.online, s.last_seen)));
  c.on("receipt", (r) => console.log(r.conv, r.mid));
  c.on("read", (r) => console.log(r.unread));
  c.on("typing", (t) => console.log(t.from));
  c.on("recalled", (r) => console.log(r.mid, r.by));
  c.on("group_event", (g) => console.log(g.event, g.users));
  c.on("notice", (n) => console.log(n.body));
  c.on("feed", (f) => console.log(f.post));
  c.on("edited", (e: EditedFrame) => console.log(e.mid, e.conv, e.body, e.edited));
  c.on("reaction", (r: ReactionFrame) => console.log(r.mid, r.from, r.emoji, r.on ? 1 : -1));
  c.on("conv_settings", (s) => console.log(s.conv, s.muted, s.pinned, s.archived));
  c.on("changed", (m: ChatMessage) => console.log(m.mid, m.recalled, m.edited, m.reactions));
  c.on("message", (m) => console.log(m.reply_to ?? 0, m.edited ?? 0, Object.entries(m.reactions ?? {}).map(([e, n]) => e + n)));

  await c.connect();
  const ack: AckFrame = await c.send("bob", { text: "hi" });
  await c.send("bob", "again", { cmid: ack.cmid });
  const g = await c.groupSend("g1", [1, 2, 3]);
  console.log(g.seq);
  await c.read("bob", ack.mid);
  c.typing("bob");
  const pr = await c.presenceSub(["bob"]);
  console.log(pr.users.bob.online);
  await c.presenceUnsub(["bob"]);
  await c.send("bob", "an answer", { replyTo: ack.mid });
  await c.groupSend("g1", "in the group", { replyTo: g.mid, cmid: "x1" });
  await c.edit(ack.mid, { text: "hi!" });
  await c.react(ack.mid, "👍");
  await c.react(ack.mid, "👍", false);
  let page: ReactionUsersPage = await c.reactionUsers(ack.mid, "👍", { limit: 50 });
  if (page.cursor) page = await c.reactionUsers(ack.mid, "👍", { cursor: page.cursor });
  console.log(page.users.length);
  const set: ConvSettingsResult = await c.setConversation("bob", { muted: true, pinned: false });
  console.log(set.ok, set.conv, set.muted, set.pinned, set.archived);
  await c.recall(ack.mid);
  const j: JoinedFrame = await c.join("room1", { history: 20 });
  console.log(j.online, j.epoch, j.msgs?.length);
  await c.roomSend("room1", { t: "x" }, { prio: 1 });
  console.log(c.roomPosition("room1")?.pos);
  await c.leave("room1");
  const convs = await c.http<{ total_unread: number }>("GET", "/v1/conversations");
  console.log(convs.total_unread);
  await c.sync();
  try {
    await c.http("GET", "/v1/groups/x");
  } catch (e) {
    if (e instanceof ImError) console.log(e.status, e.code);
  }
  console.log(c.state, c.user, c.url, c.lastMid);
  c.close();
}

declare function localStorage_set(k: string, v: string): void;
void demo;
