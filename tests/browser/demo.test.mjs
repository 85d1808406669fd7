// The demo web app (web/demo, served at /demo/ by every node) in a real browser:
// Debian's chromium driven by playwright-core. Two users on two nodes chat,
// one goes away and catches up, both meet in a live room, one posts to the feed;
// then edit, reactions, reply, recall, delete for me, pin and mute, each seen
// on the other user's page (or the same user's other page, or after a reload).
//
// Environment (tests/integration/gateway/test_demo_browser.py sets it):
//   IMGATE_HTTP_1, IMGATE_WS_1     node 1: http://host:port, ws://host:port/ws (user A)
//   IMGATE_HTTP_2, IMGATE_WS_2     node 2 (user B)
//   IMGATE_USER_A, IMGATE_TOKEN_A  user A and a token of A
//   IMGATE_USER_B, IMGATE_TOKEN_B
//   CHROMIUM                       the browser (default /usr/bin/chromium)
//   IMGATE_SCREENSHOT              optional: a PNG of A's page at the end (docs/img/demo.png)
// Exit code 0 when every step passed; otherwise 1, with screenshots of the open
// pages in tests/browser/out/. Every wait is bounded (STEP_MS), the whole run too.
import { mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const HERE = dirname(fileURLToPath(import.meta.url));
const OUT = join(HERE, "out");
const STEP_MS = 10_000;
const TOTAL_MS = 55_000;
const VIEWPORT = { width: 1200, height: 800 };

function need(name) {
  const v = process.env[name];
  if (!v) {
    console.error(`demo.test: ${name} is not set`);
    process.exit(2);
  }
  return v;
}
const env = {
  http1: need("IMGATE_HTTP_1"), ws1: need("IMGATE_WS_1"),
  http2: need("IMGATE_HTTP_2"), ws2: need("IMGATE_WS_2"),
  a: need("IMGATE_USER_A"), tokenA: need("IMGATE_TOKEN_A"),
  b: need("IMGATE_USER_B"), tokenB: need("IMGATE_TOKEN_B"),
  chromium: process.env.CHROMIUM || "/usr/bin/chromium",
  screenshot: process.env.IMGATE_SCREENSHOT || "",
};
const run = Math.random().toString(36).slice(2, 8);
const started = Date.now();
const pages = new Map(); // name -> page (open ones, for screenshots on failure)
const logs = []; // the pages' console errors and uncaught exceptions
let browser;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Poll `probe` (async, returns a value or throws) until `ok(value)`; bounded. */
async function until(what, probe, ok = Boolean, timeout = STEP_MS) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await probe();
      if (ok(last)) return last;
    } catch (e) {
      last = `(${e.message.split("\n")[0]})`;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeout} ms waiting for ${what}; last seen: ${JSON.stringify(last)}`);
    }
    await sleep(50);
  }
}

const texts = (page, sel) => page.locator(sel).allTextContents();
const textOf = async (page, sel) => ((await page.locator(sel).first().textContent()) || "").trim();

async function waitText(page, sel, want, what) {
  return until(`${what}: ${sel} = ${JSON.stringify(want)}`, () => textOf(page, sel), (t) => t === want);
}

async function waitAll(page, sel, wanted, what) {
  return until(`${what}: ${sel} shows ${JSON.stringify(wanted)}`, () => texts(page, sel),
    (all) => wanted.every((w) => all.some((t) => w.every((part) => t.includes(part)))));
}

/** A user's page: the token in the address (`?token=`), or typed into the login form;
 * `ws` in the address when given (null: the page asks the node, GET /v1/info). */
async function open(name, http, ws, token, { form = false } = {}) {
  const ctx = await browser.newContext({ viewport: VIEWPORT });
  const page = await ctx.newPage();
  page.setDefaultTimeout(STEP_MS);
  page.on("console", (m) => { if (m.type() === "error") logs.push(`${name} console: ${m.text()}`); });
  page.on("pageerror", (e) => logs.push(`${name} pageerror: ${e.message}`));
  page.on("response", (r) => { if (r.status() >= 400) logs.push(`${name} HTTP ${r.status()} ${r.request().method()} ${r.url()}`); });
  pages.set(name, page);
  const q = form ? "" : `token=${encodeURIComponent(token)}&`;
  const w = ws === null ? "" : `ws=${encodeURIComponent(ws)}`;
  await page.goto(`${http}/demo/?${q}${w}`, { timeout: STEP_MS });
  if (form) {
    await page.fill('[data-test="token"]', token);
    await page.click('[data-test="login"]');
  }
  await waitText(page, '[data-test="status"]', "online", `${name} connects`);
  return page;
}

async function close(name) {
  const page = pages.get(name);
  pages.delete(name);
  await page.context().close();
}

/** A user's page after a reload: the token is no longer in the address, so the login form. */
async function relogin(name, page, token) {
  await page.reload();
  await page.fill('[data-test="token"]', token);
  await page.click('[data-test="login"]');
  await waitText(page, '[data-test="status"]', "online", `${name} back online`);
}

/** The mid of the (first) message of `page` whose text has `body`. */
async function midOf(page, body) {
  const mid = await page.locator('[data-test="message"][data-mid]', { hasText: body }).first().getAttribute("data-mid");
  if (!mid) throw new Error(`no message ${JSON.stringify(body)}`);
  return mid;
}

/** Choose `action` (a data-test) in the menu of message `mid`. */
async function menu(page, mid, action, extra = "") {
  await page.click(`[data-test="message"][data-mid="${mid}"] [data-test="msg-menu"]`);
  await page.click(`[data-test="message"][data-mid="${mid}"] [data-test="msg-actions"] [data-test="${action}"]${extra}`);
}

const msgSel = (mid, inner = "") => `[data-test="message"][data-mid="${mid}"]${inner ? ` ${inner}` : ""}`;

async function send(page, to, body) {
  await page.fill('[data-test="to"]', to);
  await page.fill('[data-test="compose"]', body);
  await page.click('[data-test="send"]');
  // acked: shown with its mid (not "sending")
  await until(`ack of ${JSON.stringify(body)}`, () => page.locator('[data-test="message"][data-mid]').allTextContents(),
    (all) => all.some((t) => t.includes(body)));
}

let stepNo = 0;
async function step(title, fn) {
  stepNo += 1;
  const t0 = Date.now();
  try {
    await fn();
  } catch (e) {
    e.step = `${stepNo}. ${title}`;
    throw e;
  }
  console.log(`ok ${stepNo} - ${title} (${Date.now() - t0} ms)`);
}

async function main() {
  browser = await chromium.launch({ executablePath: env.chromium, headless: true, args: ["--no-sandbox"], timeout: STEP_MS });
  const { a, b } = env;
  const hello = `hello ${b}, this is ${a}`;
  const reply = `hi ${a}! ${b} here`;
  const away1 = `are you there?`;
  const away2 = `call me when you are back`;
  let A;
  let B;

  await step("A opens the demo on node 1, B on node 2: both online", async () => {
    [A, B] = await Promise.all([open("A", env.http1, env.ws1, env.tokenA), open("B", env.http2, null, env.tokenB)]);
  });

  await step("A sends to B: B's unread total goes to 1", async () => {
    await send(A, b, hello);
    await waitText(B, '[data-test="unread-total"]', "1", "B's unread");
  });

  await step("B opens the chat (reads it), A sees the receipt and B typing; B replies; both see both", async () => {
    await B.fill('[data-test="to"]', a);
    await waitAll(B, '[data-test="message"]', [[a, hello]], "B's chat");
    await waitText(B, '[data-test="unread-total"]', "0", "B's unread after reading");
    await until("A's message marked read", () => A.locator('[data-test="message"][data-state="read"]').count(), (n) => n >= 1);
    await B.fill('[data-test="compose"]', "hi");
    await until("A sees B typing", () => textOf(A, '[data-test="typing"]'), (t) => t.includes(`${b} is typing`));
    await B.fill('[data-test="compose"]', reply);
    await B.click('[data-test="send"]');
    const both = [[a, hello], [b, reply]];
    await waitAll(A, '[data-test="message"]', both, "A's chat");
    await waitAll(B, '[data-test="message"][data-mid]', both, "B's chat");
    await waitText(A, '[data-test="typing"]', "", "A's typing line cleared by the reply");
  });

  await step("B goes offline; A sends two messages", async () => {
    await waitText(B, '[data-test="unread-total"]', "0", "B's unread before leaving");
    await close("B");
    await send(A, b, away1);
    await send(A, b, away2);
  });

  await step("B comes back on node 2 (logs in with the form): unread 2 before reading, then catches up", async () => {
    // A ?ws= naming another host is ignored (the pasted token never goes there):
    // the form holds the node's own WebSocket URL, and says so.
    B = await open("B", env.http2, "ws://elsewhere.invalid:1/ws", env.tokenB, { form: true });
    const hint = await textOf(B, "#ws-hint");
    if (!hint.includes("ignored")) throw new Error(`the login form's hint: ${hint}`);
    await waitText(B, '[data-test="unread-total"]', "2", "B's unread after coming back");
    await waitText(B, `[data-test="conv"][data-conv="${a}"] [data-test="conv-unread"]`, "2", "B's chat with A");
    await B.click(`[data-test="conv"][data-conv="${a}"]`);
    await waitAll(B, '[data-test="message"]', [[a, hello], [b, reply], [a, away1], [a, away2]], "B's caught-up chat");
    await waitText(B, '[data-test="unread-total"]', "0", "B's unread after reading");
    await until("A's messages all marked read", () => A.locator('[data-test="message"][data-state="read"]').count(), (n) => n >= 3);
  });

  await step("A reloads the page and logs in again: its messages to B are still marked read", async () => {
    await A.reload();
    await A.fill('[data-test="token"]', env.tokenA);
    await A.click('[data-test="login"]');
    await waitText(A, '[data-test="status"]', "online", "A back online");
    await A.click(`[data-test="conv"][data-conv="${b}"]`);
    await waitAll(A, '[data-test="message"]', [[a, hello], [a, away1], [a, away2]], "A's chat after the reload");
    await until("A's messages marked read after the reload (peer_read)",
      () => A.locator('[data-test="message"][data-state="read"]').count(), (n) => n >= 3);
  });

  const groupText = `welcome to the crew`;
  await step("A creates a group with B and writes in it; B sees it unread, then reads it", async () => {
    await A.fill('[data-test="group-name"]', "stream crew");
    await A.fill('[data-test="group-members"]', b);
    await A.click('[data-test="group-create"]');
    const conv = await until("A's new group open", () => A.locator('[data-test="to"]').inputValue(), (v) => v.startsWith("g:"));
    await A.fill('[data-test="compose"]', groupText);
    await A.click('[data-test="send"]');
    await waitText(A, '[data-test="to-name"]', "# stream crew", "the group's name by To");
    await waitAll(A, '[data-test="message"][data-mid]', [[a, groupText]], "A's group chat");
    await waitText(B, `[data-test="group"][data-conv="${conv}"] [data-test="conv-unread"]`, "1", "B's group unread");
    await waitText(B, '[data-test="unread-total"]', "1", "B's unread with the group");
    await B.click(`[data-test="group"][data-conv="${conv}"]`);
    await waitAll(B, '[data-test="message"]', [[a, groupText]], "B's group chat");
    await waitText(B, '[data-test="unread-total"]', "0", "B's unread after reading the group");
  });

  const room = `stream-${run}`;
  await step(`both join the live room ${room}; a message each way`, async () => {
    for (const page of [A, B]) {
      await page.fill('[data-test="room"]', room);
      await page.click('[data-test="join"]');
      await until("joined", () => page.locator('[data-test="room-send"]').isEnabled());
    }
    await A.fill('[data-test="room-compose"]', `live from ${a}`);
    await A.click('[data-test="room-send"]');
    await waitAll(B, '[data-test="room-message"]', [[a, `live from ${a}`]], "B's room");
    await B.fill('[data-test="room-compose"]', `${b} waves`);
    await B.click('[data-test="room-send"]');
    await waitAll(A, '[data-test="room-message"]', [[a, `live from ${a}`], [b, `${b} waves`]], "A's room");
  });

  const postText = `first post from ${a}`;
  await step("B follows A; A posts: the post is in A's timeline and, by the feed push, in B's", async () => {
    await B.fill('[data-test="follow-user"]', a);
    await B.click('[data-test="follow"]');
    await until("B's follow answered", () => B.locator('[data-test="follow-user"]').inputValue(), (v) => v === "");
    await A.fill('[data-test="post-text"]', postText);
    await A.click('[data-test="post"]');
    await waitAll(A, '[data-test="timeline-post"]', [[a, postText]], "A's timeline");
    await waitAll(B, '[data-test="timeline-post"]', [[a, postText]], "B's timeline");
  });

  const edited = `${hello} (see you at 8)`;
  let mid;
  await step("A edits its first message from the message's menu: B sees the new text, marked (edited)", async () => {
    await A.click(`[data-test="conv"][data-conv="${b}"]`);
    await B.click(`[data-test="conv"][data-conv="${a}"]`);
    await waitAll(A, '[data-test="message"][data-mid]', [[a, hello]], "A's chat with B");
    mid = await midOf(A, hello);
    await waitAll(B, msgSel(mid), [[hello]], "B's chat with A");
    await menu(A, mid, "msg-edit");
    await until("the composer holds the text", () => A.locator('[data-test="compose"]').inputValue(), (v) => v === hello);
    await waitText(A, '[data-test="compose-context-text"]', "Editing your message", "A's composer line");
    await A.fill('[data-test="compose"]', edited);
    await A.click('[data-test="send"]');
    await waitText(B, msgSel(mid, ".body"), edited, "B's copy edited");
    await waitText(B, msgSel(mid, '[data-test="edited"]'), "(edited)", "B's copy marked");
    await waitText(A, msgSel(mid, '[data-test="edited"]'), "(edited)", "A's copy marked");
    if (await A.locator('[data-test="compose-context"]').isVisible()) throw new Error("A's composer still editing");
  });

  await step("B reacts 👍 from the reaction bar: A sees 👍 1; A adds its own: B sees 👍 2", async () => {
    await menu(B, mid, "react", '[data-emoji="👍"]');
    await waitText(A, msgSel(mid, '[data-test="reaction"][data-emoji="👍"]'), "👍 1", "A's count");
    await waitText(B, msgSel(mid, '[data-test="reaction"][data-emoji="👍"].mine'), "👍 1", "B's own count, marked mine");
    await A.click(msgSel(mid, '[data-test="reaction"][data-emoji="👍"]'));
    await waitText(B, msgSel(mid, '[data-test="reaction"][data-emoji="👍"]'), "👍 2", "B's count");
    await menu(B, mid, "react", '[data-emoji="🎉"]');
    await waitText(A, msgSel(mid, '[data-test="reaction"][data-emoji="🎉"]'), "🎉 1", "A's 🎉");
  });

  const answer = `${b} replies: 8 works`;
  await step("B replies to A's message: A sees the quoted message above the reply", async () => {
    await menu(B, mid, "msg-reply");
    await until("B's composer quotes it", () => textOf(B, '[data-test="compose-context-text"]'), (t) => t === `Replying to ${a}: ${edited}`);
    await B.fill('[data-test="compose"]', answer);
    await B.click('[data-test="send"]');
    await waitAll(A, '[data-test="message"][data-mid]', [[b, answer]], "A's chat with the reply");
    const re = await midOf(A, answer);
    await waitText(A, msgSel(re, '[data-test="quote"]'), `${a}: ${edited}`, "the quote on A's page");
    const quoted = await A.locator(msgSel(re, '[data-test="quote"]')).getAttribute("data-mid");
    if (quoted !== mid) throw new Error(`the quote names ${quoted}, not ${mid}`);
    await waitText(B, msgSel(re, '[data-test="quote"]'), `${a}: ${edited}`, "the quote on B's page");
  });

  const oops = `oops, not for ${b}`;
  await step("A recalls a message from its menu (B sees it recalled); B deletes one for itself (A keeps it, B's reload too)", async () => {
    await send(A, b, oops);
    const gone = await midOf(A, oops);
    await waitAll(B, msgSel(gone), [[oops]], "B got it");
    await menu(A, gone, "msg-recall");
    await waitText(B, msgSel(gone, ".body"), "message recalled", "B's copy recalled");
    const away = await midOf(B, away1);
    await menu(B, away, "msg-delete");
    await until("gone from B's page", () => B.locator(msgSel(away)).count(), (n) => n === 0);
    await relogin("B", B, env.tokenB);
    await B.click(`[data-test="conv"][data-conv="${a}"]`);
    await waitAll(B, '[data-test="message"][data-mid]', [[b, answer], [a, away2]], "B's chat after the reload");
    if (await B.locator(msgSel(away)).count()) throw new Error("the deleted message is back after B's reload");
    if (!(await A.locator(msgSel(away)).count())) throw new Error("A lost the message B deleted for itself");
  });

  await step("A pins and mutes its chat with B: A's other page (node 2) shows the marks at once; B's list has none", async () => {
    const A2 = await open("A2", env.http2, null, env.tokenA);
    const row = `[data-test="conv"][data-conv="${b}"]`;
    await until("A2's chat with B listed", () => A2.locator(row).count(), (n) => n === 1);
    for (const [tool, mark] of [["conv-pin", "conv-pinned"], ["conv-mute", "conv-muted"]]) {
      await A.click(`${row} [data-test="${tool}"]`);
      for (const [name, page] of [["A", A], ["A2", A2]]) {
        await until(`${name}: ${mark} mark`, () => page.locator(`${row} [data-test="${mark}"]`).count(), (n) => n === 1);
      }
    }
    // The group is the newest conversation now; the pinned chat still comes first.
    const groupRow = A.locator('[data-test="group"]').first();
    await groupRow.click();
    await A.fill('[data-test="compose"]', "pinned chats stay on top");
    await A.click('[data-test="send"]');
    await waitAll(A2, '[data-test="conv"]', [["pinned chats stay on top"]], "A2's list with the group's news");
    await until("A2's first chat", () => A2.locator('[data-test="conv"]').first().getAttribute("data-conv"), (c) => c === b);
    const marks = await B.locator(`[data-test="conv"][data-conv="${a}"] .mark`).count();
    if (marks) throw new Error("B's list shows A's settings");
  });

  await step("A's other page reloads: pinned first and muted, the edit and the reaction counts from history", async () => {
    const A2 = pages.get("A2");
    await relogin("A2", A2, env.tokenA);
    await until("A2's first chat after the reload", () => A2.locator('[data-test="conv"]').first().getAttribute("data-conv"), (c) => c === b);
    await until("A2's marks", () => A2.locator(`[data-test="conv"][data-conv="${b}"] .mark`).count(), (n) => n === 2);
    await A2.click(`[data-test="conv"][data-conv="${b}"]`);
    await waitText(A2, msgSel(mid, ".body"), edited, "the edited text");
    await waitText(A2, msgSel(mid, '[data-test="edited"]'), "(edited)", "the edited mark");
    await waitText(A2, msgSel(mid, '[data-test="reaction"][data-emoji="👍"]'), "👍 2", "the 👍 count");
    await waitText(A2, msgSel(mid, '[data-test="reaction"][data-emoji="🎉"]'), "🎉 1", "the 🎉 count");
    // After the reload the page asks who reacted: a click takes A's 👍 back, B sees it.
    await A2.click(msgSel(mid, '[data-test="reaction"][data-emoji="👍"]'));
    await waitText(B, msgSel(mid, '[data-test="reaction"][data-emoji="👍"]'), "👍 1", "B's count after A's take-back");
    await A2.click(`[data-test="conv"][data-conv="${b}"] [data-test="conv-mute"]`);
    await until("A's page unmuted", () => A.locator(`[data-test="conv"][data-conv="${b}"] [data-test="conv-muted"]`).count(), (n) => n === 0);
    await close("A2");
  });

  if (env.screenshot) {
    await step(`screenshot of A's page to ${env.screenshot}`, async () => {
      await A.click(`[data-test="conv"][data-conv="${b}"]`);
      await A.fill('[data-test="compose"]', "see you at the stream tonight");
      await A.locator('[data-test="compose"]').blur();
      await sleep(300);
      await A.screenshot({ path: env.screenshot });
    });
  }
  await step("A logs out: the login form, nothing of A left on the page", async () => {
    await A.click('[data-test="logout"]');
    await until("A's login form", () => A.locator("#login").isVisible());
    if (await A.locator("#app").isVisible()) throw new Error("the app is still shown after log-out");
    if ((await textOf(A, '[data-test="me"]')) !== "") throw new Error("A's id still shown");
  });

  await step("a token the node refuses is shown as an error, not retried in silence", async () => {
    const ctx = await browser.newContext({ viewport: VIEWPORT });
    const page = await ctx.newPage();
    page.setDefaultTimeout(STEP_MS);
    pages.set("C", page);
    await page.goto(`${env.http1}/demo/?token=not-a-token`, { timeout: STEP_MS });
    await until("the login form's error", () => textOf(page, '[data-test="login-error"]'),
      (t) => t.includes("the node refused this token (401"));
    await close("C");
  });

  if (logs.length) console.log(`page console errors (not failures):\n  ${logs.join("\n  ")}`);
}

async function shots() {
  mkdirSync(OUT, { recursive: true });
  for (const [name, page] of pages) {
    const path = join(OUT, `step${stepNo}-${name}.png`);
    try {
      await page.screenshot({ path, timeout: 3000 });
      console.error(`  screenshot: ${path}`);
    } catch (e) {
      console.error(`  no screenshot of ${name}: ${e.message.split("\n")[0]}`);
    }
  }
}

const overall = setTimeout(async () => {
  console.error(`not ok - the whole run took over ${TOTAL_MS} ms (at step ${stepNo})`);
  await shots();
  process.exit(1);
}, TOTAL_MS);

let code = 0;
try {
  await main();
  console.log(`all steps passed in ${Date.now() - started} ms`);
} catch (e) {
  code = 1;
  console.error(`not ok ${e.step || "(setup)"}\n  ${e.stack || e}`);
  if (logs.length) console.error(`page console errors:\n  ${logs.join("\n  ")}`);
  await shots();
} finally {
  clearTimeout(overall);
  if (browser) await browser.close().catch(() => {});
}
process.exit(code);
