// imgate demo: one page, one user, on the node that serves it.
// Plain DOM, no build step; the SDK is served next to it (/demo/sdk/).
import { ImClient } from "./sdk/imgate.js";

const $ = (sel) => document.querySelector(sel);
const params = new URLSearchParams(location.search);

// ---- where the node is --------------------------------------------------
// The HTTP API is this page's own origin; the node tells where its WebSocket
// is (GET /v1/info). A ?ws= in the address is used only on this page's own
// host: a link naming another host would send it the token the user pastes.
function sameHost(url) {
  try { return new URL(url).hostname === location.hostname; } catch { return false; }
}
const HTTP_URL = location.origin;
const WS_ASKED = params.get("ws") || "";
const WS_REFUSED = WS_ASKED && !sameHost(WS_ASKED) ? WS_ASKED : "";
let WS_DEFAULT = WS_ASKED && !WS_REFUSED ? WS_ASKED : "";

async function wsDefault() {
  if (WS_DEFAULT) return WS_DEFAULT;
  try {
    const r = await fetch("/v1/info");
    if (r.ok) WS_DEFAULT = (await r.json()).ws_url;
  } catch { /* the fallback below */ }
  if (!WS_DEFAULT) { // an older node: this origin's /ws behind a proxy, else the HTTP port minus one
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    WS_DEFAULT = location.port ? `${scheme}//${location.hostname}:${Number(location.port) - 1}/ws`
      : `${scheme}//${location.host}/ws`;
  }
  return WS_DEFAULT;
}

// ---- state ----------------------------------------------------------------
const state = {
  client: null,
  me: "",
  active: "", // conversation shown: a user id, or g:GROUP
  msgs: new Map(), // conv -> Map(mid -> message)
  pending: new Map(), // conv -> [{tmp, from, body, ts}] not acked yet
  convs: [], // from GET /v1/conversations
  groups: new Map(), // group id -> {group, name, owner, members}
  peerRead: new Map(), // conv -> highest mid the peer has read (receipts)
  readSent: new Map(), // conv -> highest mid we marked read
  typing: new Map(), // conv -> {from, until}
  room: "", // the live room joined
  lastTyping: 0,
  compose: null, // {kind: "reply" | "edit", conv, mid}: what the composer is doing besides a plain send
  menu: 0, // mid of the message whose menu is open
  mine: new Map(), // "mid emoji" -> whether we reacted so (reaction pushes; asked after a reload)
  settings: new Map(), // conv -> {muted, pinned, archived, tick}: the last conv_settings seen
  settingsTick: 0, // bumped at each conv_settings seen
};

const EMOJI = ["👍", "❤️", "😂", "🎉", "😮"]; // the reaction bar

// ---- small helpers ------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

function text(body) {
  if (typeof body === "string") return body;
  if (body && typeof body === "object" && typeof body.text === "string") return body.text;
  return JSON.stringify(body);
}

function clock(ts) {
  if (!ts) return "";
  const d = new Date(ts);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function toast(message, kind = "info") {
  const t = el("div", { class: `toast ${kind}`, "data-test": kind === "error" ? "error" : "toast" }, message);
  $(".toasts").append(t);
  setTimeout(() => t.remove(), kind === "error" ? 8000 : 5000);
}

function subOf(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part + "=".repeat((4 - (part.length % 4)) % 4))).sub || "";
  } catch {
    return "";
  }
}

/** Run fn at most once per `ms`, the last call winning (refreshes after bursts of pushes). */
function debounced(fn, ms) {
  let timer = null;
  return () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      timer = null;
      fn().catch((e) => toast(`${e.message || e}`, "error"));
    }, ms);
  };
}

const isGroup = (conv) => conv.startsWith("g:");
const ID = /^[A-Za-z0-9_.:-]{1,64}$/;

function convOf(m) {
  if (m.group) return `g:${m.group}`;
  if (m.conv && isGroup(m.conv)) return m.conv;
  return m.from === state.me ? m.to : m.from;
}

function convName(conv) {
  if (!isGroup(conv)) return conv;
  const g = state.groups.get(conv.slice(2));
  return g ? `# ${g.name}` : `# ${conv.slice(2)}`;
}

function bucket(conv) {
  let b = state.msgs.get(conv);
  if (!b) state.msgs.set(conv, (b = new Map()));
  return b;
}

/** A message as the node stored it (a push, sync or history entry): its counts are the node's.
 * An edit or a recall pushed while the entry was on its way is newer than it: kept. */
function keep(conv, m) {
  const b = bucket(conv);
  const had = b.get(m.mid);
  const next = { ...had, ...m, conv, reactions: { ...(m.reactions || {}) } };
  if (had && (had.edited || 0) > (m.edited || 0)) Object.assign(next, { body: had.body, edited: had.edited });
  if (had && had.recalled) next.recalled = true;
  b.set(m.mid, next);
}

/** Who a quoted message is, as loaded here ("a message" when it is not). */
function quoteText(conv, mid) {
  const q = bucket(conv).get(mid);
  if (!q) return "a message";
  return `${q.from}: ${q.recalled ? "message recalled" : text(q.body)}`;
}

// ---- messages -------------------------------------------------------------
function addMessage(m) {
  if (m.mid === undefined || m.mid === null) return;
  const conv = convOf(m);
  if (!conv) return;
  keep(conv, m);
  const theirs = m.from !== state.me;
  if (theirs) {
    const t = state.typing.get(conv);
    if (t && t.from === m.from) state.typing.delete(conv);
  }
  if (conv === state.active) {
    renderMessages();
    if (theirs) markRead(); // shown: read (our own need no read mark)
  }
  refreshConvs();
}

function renderMessages() {
  const list = $('[data-test="messages"]');
  const conv = state.active;
  list.replaceChildren();
  if (!conv) {
    list.append(el("li", { class: "empty" }, "Pick a chat on the left, or type a user id in To."));
    renderTyping();
    return;
  }
  const msgs = [...bucket(conv).values()].sort((a, b) => a.mid - b.mid);
  const peerRead = state.peerRead.get(conv) || 0;
  for (const m of msgs) {
    const mine = m.from === state.me;
    let status = "";
    if (mine && !isGroup(conv)) status = m.mid <= peerRead ? "read" : "sent";
    list.append(el("li", {
      class: `msg ${mine ? "mine" : "theirs"}${m.recalled ? " recalled" : ""}`,
      "data-test": "message", "data-mid": m.mid, "data-from": m.from,
      "data-state": status || undefined,
    },
    el("div", { class: "msg-head" },
      el("span", { class: "from" }, mine ? `${m.from} (me)` : m.from),
      el("button", {
        type: "button", class: "more", title: "more", "data-test": "msg-menu",
        onclick: () => { state.menu = state.menu === m.mid ? 0 : m.mid; renderMessages(); },
      }, "⋯")),
    m.reply_to ? quote(conv, m.reply_to) : null,
    el("span", { class: "body" }, m.recalled ? "message recalled" : text(m.body)),
    el("span", { class: "meta" }, clock(m.ts),
      m.edited && !m.recalled ? el("span", { class: "edited", "data-test": "edited" }, " (edited)") : null,
      status ? ` · ${status}` : ""),
    m.recalled ? null : reactionChips(m),
    state.menu === m.mid ? messageMenu(m) : null));
  }
  for (const p of state.pending.get(conv) || []) {
    list.append(el("li", { class: "msg mine pending", "data-test": "message", "data-from": state.me, "data-state": "sending" },
      el("span", { class: "from" }, `${state.me} (me)`),
      p.replyTo ? quote(conv, p.replyTo) : null,
      el("span", { class: "body" }, text(p.body)),
      el("span", { class: "meta" }, "sending…")));
  }
  if (!msgs.length && !(state.pending.get(conv) || []).length) {
    list.append(el("li", { class: "empty" }, `No messages with ${convName(conv)} yet.`));
  }
  list.scrollTop = list.scrollHeight;
  renderTyping();
}

/** The quoted message above a reply: a click shows it, when it is loaded. */
function quote(conv, mid) {
  return el("div", {
    class: "quote", "data-test": "quote", "data-mid": mid,
    onclick: () => {
      const at = document.querySelector(`[data-test="message"][data-mid="${mid}"]`);
      if (at) at.scrollIntoView({ block: "center" });
    },
  }, quoteText(conv, mid));
}

/** The counts under a message; a click adds or takes back one's own. */
function reactionChips(m) {
  const entries = Object.entries(m.reactions || {}).filter(([, n]) => n > 0);
  if (!entries.length) return null;
  return el("div", { class: "reactions", "data-test": "reactions" },
    entries.map(([emoji, n]) => el("button", {
      type: "button", class: `reaction${state.mine.get(`${m.mid} ${emoji}`) ? " mine" : ""}`,
      "data-test": "reaction", "data-emoji": emoji, title: "react",
      onclick: () => toggleReaction(m.conv, m.mid, emoji),
    }, `${emoji} ${n}`)));
}

/** A message's menu: the reaction bar, reply, edit and recall (one's own), delete for me (1:1). */
function messageMenu(m) {
  const mine = m.from === state.me;
  const item = (test, label, fn, attrs = {}) => el("button", {
    type: "button", "data-test": test, ...attrs,
    onclick: () => {
      state.menu = 0;
      renderMessages();
      fn();
    },
  }, label);
  return el("div", { class: "msg-menu", "data-test": "msg-actions" },
    m.recalled ? null : el("div", { class: "react-bar" },
      EMOJI.map((emoji) => item("react", emoji, () => toggleReaction(m.conv, m.mid, emoji), { "data-emoji": emoji, title: `react ${emoji}` }))),
    m.recalled ? null : item("msg-reply", "Reply", () => startCompose("reply", m)),
    mine && !m.recalled ? item("msg-edit", "Edit", () => startCompose("edit", m)) : null,
    mine && !m.recalled ? item("msg-recall", "Recall", () => recallMessage(m)) : null,
    isGroup(m.conv) ? null : item("msg-delete", "Delete for me", () => deleteForMe(m)),
    item("msg-close", "✕", () => {}, { title: "close" }));
}

function renderTyping() {
  const t = state.typing.get(state.active);
  const box = $('[data-test="typing"]');
  box.textContent = t && t.until > Date.now() ? `${t.from} is typing…` : "";
}

/** Mark the shown conversation read up to its newest message (only while the page is visible). */
async function markRead() {
  const conv = state.active;
  if (!conv || document.visibilityState !== "visible" || !state.client) return;
  let top = 0;
  for (const mid of bucket(conv).keys()) top = Math.max(top, mid);
  const info = state.convs.find((c) => c.conv === conv);
  if (info && info.last && info.last.mid) top = Math.max(top, info.last.mid);
  const unread = info ? info.unread : 0;
  if (!top || (top <= (state.readSent.get(conv) || 0) && !unread)) return;
  state.readSent.set(conv, top);
  try {
    await state.client.read(conv, top);
  } catch (e) {
    state.readSent.delete(conv);
    toast(`read: ${e.message || e}`, "error");
  }
  refreshConvs();
}

async function openConv(conv) {
  conv = conv.trim();
  if (conv === state.active) return;
  state.active = conv;
  state.menu = 0;
  if (state.compose && state.compose.conv !== conv) endCompose();
  const to = $("#to");
  if (to.value.trim() !== conv) to.value = conv;
  showToName();
  renderConvs();
  renderMessages();
  renderPresence();
  if (!conv || !ID.test(conv) || conv === state.me) return;
  try {
    const page = await state.client.http("GET", `/v1/history/${encodeURIComponent(conv)}?limit=50`);
    for (const m of page.msgs || []) keep(conv, m);
  } catch (e) {
    if (conv === state.active) toast(`history: ${e.message || e}`, "error");
  }
  if (conv !== state.active) return;
  renderMessages();
  markRead();
  if (!isGroup(conv)) {
    try {
      const r = await state.client.presenceSub([conv]);
      showPresence(r && r.users);
    } catch { /* presence is a nicety */ }
  }
}

async function sendMessage(e) {
  e.preventDefault();
  const to = $("#to").value.trim();
  const input = $("#compose");
  const body = input.value.trim();
  if (!to || !body) return;
  if (!ID.test(to)) return toast(`"${to}" is not a user id (or g:GROUP)`, "error");
  const ctx = state.compose;
  if (ctx && ctx.kind === "edit") return saveEdit(ctx, body);
  if (to !== state.active) await openConv(to);
  const replyTo = ctx && ctx.kind === "reply" && ctx.conv === to ? ctx.mid : 0;
  endCompose();
  input.value = "";
  const p = { tmp: Math.random(), body, replyTo };
  const list = state.pending.get(to) || [];
  list.push(p);
  state.pending.set(to, list);
  renderMessages();
  try {
    const opts = replyTo ? { replyTo } : {};
    const ack = isGroup(to) ? await state.client.groupSend(to.slice(2), body, opts)
      : await state.client.send(to, body, opts);
    const m = { mid: ack.mid, from: state.me, body, ts: ack.ts };
    if (replyTo) m.reply_to = replyTo;
    if (isGroup(to)) Object.assign(m, { group: to.slice(2), seq: ack.seq });
    else m.to = to;
    state.pending.set(to, (state.pending.get(to) || []).filter((x) => x !== p));
    addMessage(m);
  } catch (err) {
    state.pending.set(to, (state.pending.get(to) || []).filter((x) => x !== p));
    renderMessages();
    input.value = body;
    toast(`send: ${err.message || err.code || err}`, "error");
  }
}

// ---- reply, edit, recall, delete, reactions ------------------------------
/** The composer replies to, or edits, message `m` (the line above it says which; ✕ cancels). */
function startCompose(kind, m) {
  state.compose = { kind, conv: m.conv, mid: m.mid };
  const input = $("#compose");
  if (kind === "edit") input.value = text(m.body);
  $('[data-test="compose-context-text"]').textContent = kind === "edit"
    ? "Editing your message" : `Replying to ${quoteText(m.conv, m.mid)}`;
  const box = $('[data-test="compose-context"]');
  box.dataset.kind = kind;
  box.hidden = false;
  $('[data-test="send"]').textContent = kind === "edit" ? "Save" : "Send";
  renderMessages();
  input.focus();
}

function endCompose() {
  const was = state.compose;
  state.compose = null;
  $('[data-test="compose-context"]').hidden = true;
  $('[data-test="send"]').textContent = "Send";
  if (was && was.kind === "edit") $("#compose").value = "";
}

async function saveEdit(ctx, value) {
  const m = bucket(ctx.conv).get(ctx.mid);
  // An object body keeps its other fields: only its text is the user's.
  const body = m && m.body && typeof m.body === "object" && !Array.isArray(m.body) ? { ...m.body, text: value } : value;
  endCompose();
  try {
    await state.client.edit(ctx.mid, body);
    if (m && !m.recalled) Object.assign(m, { body, edited: m.edited || Date.now() }); // the push brings the node's time
    if (ctx.conv === state.active) renderMessages();
    refreshConvs();
  } catch (err) {
    toast(`edit: ${err.message || err.code || err}`, "error");
  }
}

async function recallMessage(m) {
  try {
    await state.client.recall(m.mid);
    m.recalled = true;
    if (m.conv === state.active) renderMessages();
    refreshConvs();
  } catch (err) {
    toast(`recall: ${err.message || err.code || err}`, "error");
  }
}

/** Out of this user's box only (the peer keeps it); no push: this page drops it. */
async function deleteForMe(m) {
  try {
    await state.client.http("DELETE", `/v1/messages/${m.mid}`);
    bucket(m.conv).delete(m.mid);
    if (m.conv === state.active) renderMessages();
    refreshConvs();
  } catch (err) {
    toast(`delete: ${err.message || err.code || err}`, "error");
  }
}

/** Did we react to `m` with `emoji`? Known from pushes; else (after a reload) asked of the node. */
async function iReacted(m, emoji) {
  const key = `${m.mid} ${emoji}`;
  if (state.mine.has(key)) return state.mine.get(key);
  if (!(m.reactions && m.reactions[emoji])) return false;
  let cursor = null;
  do {
    const page = await state.client.reactionUsers(m.mid, emoji, { cursor, limit: 100 });
    if (page.users.includes(state.me)) return true;
    cursor = page.cursor;
  } while (cursor);
  return false;
}

/** Our `emoji` on message `mid`, on or off; the counts move with the `reaction` pushes. */
async function toggleReaction(conv, mid, emoji) {
  const m = bucket(conv).get(mid);
  if (!m) return;
  try {
    const on = !(await iReacted(m, emoji));
    await state.client.react(mid, emoji, on);
    state.mine.set(`${mid} ${emoji}`, on);
    if (conv === state.active) renderMessages();
  } catch (err) {
    toast(`react: ${err.message || err.code || err}`, "error");
  }
}

function onReaction(r) {
  if (r.from === state.me) state.mine.set(`${r.mid} ${r.emoji}`, r.on);
  const m = bucket(r.conv).get(r.mid);
  if (m) {
    const counts = m.reactions || (m.reactions = {});
    const n = (counts[r.emoji] || 0) + (r.on ? 1 : -1);
    if (n > 0) counts[r.emoji] = n;
    else delete counts[r.emoji];
  }
  if (r.conv === state.active) renderMessages();
}

/** A message we had, as it is now (sync brought it again: edited, other counts, recalled). */
function onChanged(m) {
  const conv = convOf(m);
  if (!conv || !bucket(conv).has(m.mid)) return; // not loaded: its history brings it as it is
  keep(conv, m);
  if (conv === state.active) renderMessages();
  refreshConvs();
}

function onEdited(e) {
  const m = bucket(e.conv).get(e.mid);
  if (m && !m.recalled) Object.assign(m, { body: e.body, edited: e.edited });
  if (e.conv === state.active) renderMessages();
  refreshConvs(); // its preview, if it was the last
}

// ---- conversations, groups ---------------------------------------------
const refreshConvs = debounced(async () => {
  if (!state.client) return;
  const asked = state.settingsTick;
  const r = await state.client.http("GET", "/v1/conversations?limit=50");
  state.convs = r.conversations || [];
  for (const c of state.convs) { // a setting changed while the list was on its way is the newer one
    const s = state.settings.get(c.conv);
    if (s && s.tick > asked) Object.assign(c, { muted: s.muted, pinned: s.pinned, archived: s.archived });
  }
  for (const c of state.convs) { // how far each peer has read: receipts survive a reload
    if (c.peer_read) state.peerRead.set(c.conv, Math.max(state.peerRead.get(c.conv) || 0, c.peer_read));
  }
  if (state.active && !isGroup(state.active)) renderMessages();
  $('[data-test="unread-total"]').textContent = String(r.total_unread || 0);
  $('[data-test="unread-total"]').dataset.count = String(r.total_unread || 0);
  renderConvs();
}, 120);

/** A conversation's name with its marks (pinned, muted), and its pin / mute switches. */
function convLabel(c, name) {
  return el("span", { class: "name" },
    c.pinned ? el("span", { class: "mark", "data-test": "conv-pinned", title: "pinned" }, "📌 ") : null,
    name,
    c.muted ? el("span", { class: "mark", "data-test": "conv-muted", title: "muted" }, " 🔕") : null);
}

function convTools(c) {
  const tool = (test, key, on, off) => el("button", {
    type: "button", class: "tool", "data-test": test, title: c[key] ? off : on,
    onclick: (e) => {
      e.stopPropagation();
      const now = state.convs.find((x) => x.conv === c.conv) || c; // as the latest list or push has it
      setConv(c.conv, key, !now[key]);
    },
  }, c[key] ? off : on);
  return el("span", { class: "tools" }, tool("conv-pin", "pinned", "pin", "unpin"), tool("conv-mute", "muted", "mute", "unmute"));
}

/** `list`'s items replaced by `items`, unless they show the same: a refresh that changed
 * nothing leaves the rows (and a click on one) alone. */
function swap(list, items) {
  const box = document.createElement(list.tagName);
  box.append(...items);
  if (box.innerHTML !== list.innerHTML) list.replaceChildren(...box.childNodes);
}

function renderConvs() {
  const rows = [];
  // Pinned first (the node lists them first too), otherwise as the node ordered them.
  const shown = state.convs.filter((c) => c.last || c.unread)
    .sort((a, b) => Number(Boolean(b.pinned)) - Number(Boolean(a.pinned)));
  for (const c of shown) {
    const last = c.last ? `${c.last.from === state.me ? "me: " : ""}${c.last.recalled ? "(recalled)" : text(c.last.body)}` : "";
    rows.push(el("li", {
      class: `conv${c.conv === state.active ? " active" : ""}${c.muted ? " muted" : ""}`, "data-test": "conv", "data-conv": c.conv,
      "data-pinned": c.pinned ? "1" : undefined, "data-muted": c.muted ? "1" : undefined,
      onclick: () => openConv(c.conv),
    },
    convLabel(c, convName(c.conv)),
    c.unread ? el("span", { class: "badge", "data-test": "conv-unread" }, c.unread) : null,
    el("span", { class: "last" }, last),
    convTools(c)));
  }
  if (!shown.length) rows.push(el("li", { class: "empty" }, "No chats yet."));
  swap($('[data-test="conversations"]'), rows);
  const groups = [];
  for (const g of [...state.groups.values()].sort((a, b) => a.name.localeCompare(b.name))) {
    const conv = `g:${g.group}`;
    const c = state.convs.find((x) => x.conv === conv) || { conv };
    const unread = c.unread || 0;
    groups.push(el("li", {
      class: `conv${conv === state.active ? " active" : ""}${c.muted ? " muted" : ""}`, "data-test": "group", "data-conv": conv,
      onclick: () => openConv(conv),
    },
    convLabel(c, `# ${g.name}`),
    unread ? el("span", { class: "badge", "data-test": "conv-unread" }, unread) : null,
    el("span", { class: "last" }, `${g.members} member${g.members === 1 ? "" : "s"}`),
    convTools(c)));
  }
  if (!state.groups.size) groups.push(el("li", { class: "empty" }, "No groups."));
  swap($('[data-test="groups"]'), groups);
}

/** Mute or pin a conversation: this user's setting, on all its devices (they get `conv_settings`). */
async function setConv(conv, key, value) {
  try {
    onConvSettings(await state.client.setConversation(conv, { [key]: value }));
  } catch (err) {
    toast(`${key === "pinned" ? "pin" : "mute"}: ${err.message || err.code || err}`, "error");
  }
}

function onConvSettings(s) {
  state.settings.set(s.conv, { muted: s.muted, pinned: s.pinned, archived: s.archived, tick: ++state.settingsTick });
  const row = state.convs.find((c) => c.conv === s.conv);
  if (!row) return refreshConvs(); // not listed yet
  Object.assign(row, { muted: s.muted, pinned: s.pinned, archived: s.archived });
  renderConvs();
}

const refreshGroups = debounced(async () => {
  const r = await state.client.http("GET", "/v1/groups");
  state.groups = new Map((r.groups || []).map((g) => [g.group, g]));
  renderConvs();
  showToName();
}, 120);

/** A group's name beside "To" (the field itself holds the id sends go to). */
function showToName() {
  const conv = state.active || "";
  $('[data-test="to-name"]').textContent = isGroup(conv) ? convName(conv) : "";
}

async function createGroup(e) {
  e.preventDefault();
  const name = $("#group-name").value.trim();
  const members = $("#group-members").value.split(/[\s,]+/).filter(Boolean);
  if (!name) return;
  try {
    const r = await state.client.http("POST", "/v1/groups", { name, members });
    $("#group-name").value = "";
    $("#group-members").value = "";
    refreshGroups();
    refreshConvs();
    openConv(`g:${r.group}`);
  } catch (err) {
    toast(`group: ${err.message || err}`, "error");
  }
}

// ---- presence ---------------------------------------------------------------
const presence = new Map();
function showPresence(users) {
  for (const [u, s] of Object.entries(users || {})) presence.set(u, s);
  renderPresence();
}
function renderPresence() {
  const box = $('[data-test="presence"]');
  const s = presence.get(state.active);
  if (!state.active || isGroup(state.active) || !s) {
    box.textContent = "";
    box.className = "presence";
    return;
  }
  box.className = `presence ${s.online ? "on" : "off"}`;
  box.textContent = s.online ? "online" : s.last_seen ? `last seen ${clock(s.last_seen)}` : "offline";
}

// ---- live room --------------------------------------------------------------
// The SDK drops repeated positions (the overlap around a join, a recovery),
// resets them on a new epoch and rejoins with `since` after a reconnect.
function roomAdd(room, msgs) {
  if (room !== state.room) return;
  const list = $('[data-test="room-messages"]');
  for (const m of msgs || []) {
    list.append(el("li", { class: `room-msg${m.from === state.me ? " mine" : ""}`, "data-test": "room-message", "data-from": m.from, "data-pos": m.pos },
      el("span", { class: "from" }, m.from), " ", el("span", { class: "body" }, text(m.body))));
  }
  while (list.children.length > 200) list.firstChild.remove();
  list.scrollTop = list.scrollHeight;
  refreshRoomOnline();
}

const refreshRoomOnline = debounced(async () => {
  if (!state.room) return;
  const r = await state.client.http("GET", `/v1/rooms/${encodeURIComponent(state.room)}`);
  if (r.room === state.room) $('[data-test="room-online"]').textContent = `${r.online} online`;
}, 500);

function roomRecovered(r) {
  if (r.room !== state.room) return;
  if (!r.recovered) {
    $('[data-test="room-messages"]').append(el("li", { class: "divider", "data-test": "room-gap" }, "some messages were missed"));
  }
  roomAdd(r.room, r.msgs);
}

function roomLeft(f) {
  if (f.room !== state.room) return;
  toast(`left ${f.room}${f.reason ? ` (${f.reason})` : ""}`, "error");
  leaveRoom();
}

async function joinRoom(e) {
  e.preventDefault();
  const room = $("#room").value.trim();
  if (!room || room === state.room) return;
  if (!ID.test(room)) return toast(`"${room}" is not a room id`, "error");
  if (state.room) await leaveRoom();
  state.room = room;
  $('[data-test="room-messages"]').replaceChildren();
  try {
    const joined = await state.client.join(room, { history: 20 });
    roomAdd(room, joined && joined.msgs);
    $('[data-test="room-online"]').textContent = joined && joined.online ? `${joined.online} online` : "";
    for (const id of ["#leave", "#room-compose", "#room-send"]) $(id).disabled = false;
    document.body.dataset.room = room;
  } catch (err) {
    state.room = "";
    toast(`join: ${err.message || err}`, "error");
  }
}

async function leaveRoom() {
  const room = state.room;
  if (!room) return;
  state.room = "";
  delete document.body.dataset.room;
  for (const id of ["#leave", "#room-compose", "#room-send"]) $(id).disabled = true;
  $('[data-test="room-online"]').textContent = "";
  try { await state.client.leave(room); } catch { /* gone anyway */ }
}

async function roomSend(e) {
  e.preventDefault();
  const input = $("#room-compose");
  const body = input.value.trim();
  if (!body || !state.room) return;
  input.value = "";
  try {
    await state.client.roomSend(state.room, body);
  } catch (err) {
    input.value = body;
    toast(`room: ${err.message || err}`, "error");
  }
}

// ---- feed -------------------------------------------------------------------
const refreshTimeline = debounced(async () => {
  const r = await state.client.http("GET", "/v1/timeline?limit=30");
  const list = $('[data-test="timeline"]');
  list.replaceChildren();
  for (const p of r.posts || []) {
    const shown = p.repost_of && p.original ? p.original : p;
    list.append(el("li", { class: "post", "data-test": "timeline-post", "data-post": p.id, "data-author": p.author },
      el("div", { class: "post-head" },
        el("span", { class: "from" }, p.author), p.repost_of ? el("span", { class: "meta" }, ` reposted ${shown.author || ""}`) : null,
        el("span", { class: "meta" }, ` · ${clock(p.ts)}`)),
      el("div", { class: "body" }, shown.deleted ? "(deleted)" : shown.text || ""),
      el("button", { type: "button", class: "like", title: "like", onclick: () => like(p.id) }, `♥ ${(p.counts && p.counts.likes) || 0}`)));
  }
  if (!list.children.length) list.append(el("li", { class: "empty" }, "Nothing yet: post, or follow someone."));
}, 150);

async function like(id) {
  try {
    await state.client.http("POST", `/v1/posts/${id}/like`);
    refreshTimeline();
  } catch (err) {
    toast(`like: ${err.message || err}`, "error");
  }
}

async function post(e) {
  e.preventDefault();
  const box = $("#post-text");
  const t = box.value.trim();
  if (!t) return;
  try {
    await state.client.http("POST", "/v1/posts", { text: t });
    box.value = "";
    refreshTimeline();
  } catch (err) {
    toast(`post: ${err.message || err}`, "error");
  }
}

async function follow(e) {
  e.preventDefault();
  const who = $("#follow-user").value.trim();
  if (!who) return;
  try {
    await state.client.http("POST", `/v1/follow/${encodeURIComponent(who)}`);
    $("#follow-user").value = "";
    toast(`following ${who}`);
    refreshTimeline();
  } catch (err) {
    toast(`follow: ${err.message || err}`, "error");
  }
}

// ---- wiring -----------------------------------------------------------------
function setStatus(s) {
  const box = $('[data-test="status"]');
  box.textContent = s;
  box.dataset.state = s;
}

/** Back to the login form, saying why (a refused token, a stopped client) or not
 * (log-out): the page loads again, so nothing of the last user stays in it. */
function backToLogin(message = "") {
  const c = state.client;
  state.client = null;
  if (c) c.close();
  if (message) sessionStorage.setItem("imgate.loginError", message);
  location.replace(location.pathname + (WS_ASKED && !WS_REFUSED ? `?ws=${encodeURIComponent(WS_ASKED)}` : ""));
}

/** Does the node take this token? An answer the user can act on, before any WebSocket. */
async function tokenRefusal(token) {
  let r;
  try {
    r = await fetch(`${HTTP_URL}/v1/conversations?limit=1`, { headers: { Authorization: `Bearer ${token}` } });
  } catch {
    return `cannot reach the node at ${HTTP_URL}`;
  }
  if (r.status !== 401 && r.status !== 403) return "";
  let why = "";
  try { why = ((await r.json()).error || {}).message || ""; } catch { /* not JSON */ }
  return `the node refused this token (${r.status}${why ? `: ${why}` : ""})`;
}

async function start(token, wsUrl) {
  const refused = await tokenRefusal(token);
  if (refused) return backToLogin(refused);
  $("#login-error").hidden = true;
  $("#logout").hidden = false;
  state.me = subOf(token);
  $('[data-test="me"]').textContent = state.me || "(unknown user)";
  $('[data-test="endpoints"]').textContent = `http ${HTTP_URL} · ws ${wsUrl}`;
  document.title = `${state.me} · imgate demo`;
  $("#login").hidden = true;
  $("#app").hidden = false;
  const c = new ImClient({ url: wsUrl, httpUrl: HTTP_URL, token });
  state.client = c;
  c.on("state", (s) => {
    if (state.client !== c) return; // logged out
    setStatus(s);
    if (s === "offline" && !state.outage) { // once per outage; the SDK keeps retrying
      state.outage = true;
      toast(`lost the node at ${wsUrl}: reconnecting...`, "error");
    }
    if (s === "online") {
      state.outage = false;
      refreshGroups();
      refreshConvs();
      refreshTimeline();
    }
  });
  c.on("message", (m) => addMessage(m));
  c.on("read", () => refreshConvs());
  c.on("receipt", (r) => {
    state.peerRead.set(r.conv, Math.max(state.peerRead.get(r.conv) || 0, r.mid));
    if (r.conv === state.active) renderMessages();
  });
  c.on("typing", (t) => {
    if (t.from === state.me) return;
    state.typing.set(t.conv, { from: t.from, until: Date.now() + 4000 });
    renderTyping();
    setTimeout(renderTyping, 4100);
  });
  c.on("presence", (p) => showPresence(p.users));
  c.on("edited", onEdited);
  c.on("changed", onChanged);
  c.on("reaction", onReaction);
  c.on("conv_settings", onConvSettings);
  c.on("recalled", (r) => {
    const b = state.msgs.get(r.conv);
    const m = b && b.get(r.mid);
    if (m) m.recalled = true;
    if (r.conv === state.active) renderMessages();
    refreshConvs();
  });
  c.on("group_event", () => { refreshGroups(); refreshConvs(); });
  c.on("notice", (n) => toast(`notice: ${text(n.body)}`));
  c.on("feed", () => refreshTimeline());
  c.on("room", (f) => roomAdd(f.room, f.msgs));
  c.on("room_recovered", roomRecovered);
  c.on("room_left", roomLeft);
  c.on("error", (e) => toast(`${(e && (e.message || e.code)) || e}`, "error"));
  c.on("closed", (e) => {
    // 4001: token expired, 4003: closed by the product's backend (the SDK stops);
    // anything else: the SDK reconnects by itself (status shows it).
    if (e && (e.code === 4001 || e.code === 4003)) toast(`connection closed (${e.code}${e.reason ? `: ${e.reason}` : ""})`, "error");
  });
  renderConvs();
  renderMessages();
  try {
    await c.connect();
  } catch (err) {
    // The SDK stops on a refused token (401), a ban or a kick (403, 4003): say so.
    if (state.client === c) backToLogin(`stopped: ${err.message || err.code || err}`);
  }
}

function refusedNote() {
  return WS_REFUSED ? `?ws=${WS_REFUSED} ignored: not on this page's host (${location.hostname}). ` : "";
}

let loginWired = false;
function showLogin() {
  $("#login").hidden = false;
  $("#ws-hint").textContent = refusedNote() + (WS_ASKED && !WS_REFUSED
    ? "WebSocket from ?ws= in the address."
    : "WebSocket: as this node tells (GET /v1/info); ?ws=ws://host:port/ws in the address "
      + "picks another on this host.");
  if (!loginWired) {
    loginWired = true;
    $("#login-form").addEventListener("submit", async (e) => {
      e.preventDefault();
      const token = $("#token").value.trim();
      if (token) start(token, $("#ws-url").value.trim() || await wsDefault());
    });
  }
  wsDefault().then((ws) => { if (!$("#ws-url").value) $("#ws-url").value = ws; });
  const why = sessionStorage.getItem("imgate.loginError") || "";
  sessionStorage.removeItem("imgate.loginError");
  $("#login-error").textContent = why;
  $("#login-error").hidden = !why;
  $("#token").focus();
}

function wire() {
  $("#compose-form").addEventListener("submit", sendMessage);
  $('[data-test="compose-cancel"]').addEventListener("click", () => endCompose());
  // A click anywhere else closes an open message menu.
  document.addEventListener("click", (e) => {
    if (!state.menu || e.target.closest('[data-test="msg-actions"], [data-test="msg-menu"]')) return;
    state.menu = 0;
    renderMessages();
  });
  $("#compose").addEventListener("input", () => {
    const now = Date.now();
    if (state.client && state.active && ID.test(state.active) && now - state.lastTyping > 2000) {
      state.lastTyping = now;
      try { state.client.typing(state.active); } catch { /* best effort */ }
    }
  });
  let toTimer = null;
  $("#to").addEventListener("input", () => {
    clearTimeout(toTimer);
    toTimer = setTimeout(() => {
      const v = $("#to").value.trim();
      if (!v || ID.test(v)) openConv(v);
    }, 400);
  });
  $("#group-form").addEventListener("submit", createGroup);
  $("#join-form").addEventListener("submit", joinRoom);
  $("#leave").addEventListener("click", () => {
    leaveRoom();
    $('[data-test="room-messages"]').replaceChildren();
  });
  $("#room-form").addEventListener("submit", roomSend);
  $("#post-form").addEventListener("submit", post);
  $("#logout").addEventListener("click", () => backToLogin());
  $("#follow-form").addEventListener("submit", follow);
  document.addEventListener("visibilitychange", () => markRead());
  setInterval(renderTyping, 1000);
  setInterval(() => state.room && state.client && state.client.state === "online" && refreshRoomOnline(), 10000);
}

wire();
const given = params.get("token");
if (given) {
  history.replaceState(null, "", location.pathname + (WS_ASKED && !WS_REFUSED ? `?ws=${encodeURIComponent(WS_ASKED)}` : ""));
  if (WS_REFUSED) toast(refusedNote(), "error");
  wsDefault().then((ws) => start(given, ws));
} else {
  showLogin();
}
