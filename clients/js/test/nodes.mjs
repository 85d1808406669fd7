// Real gateway nodes for tests (the SDK's and the browser tests'): start
// `python -m gateway serve` processes in a namespace of their own, sign tokens,
// call the server API, and drop the namespace afterwards.
//
//   import { newNamespace, startNode, token, dropNamespace } from "./nodes.mjs";
//   const ns = newNamespace();
//   const a = await startNode({ namespace: ns });     // a.wsUrl, a.httpUrl, a.kill(), a.stop()
//   const t = token("alice");                          // HS256, signed with SECRET
//   ...; await stopAll(); await dropNamespace(ns);
//
// IM_REDIS_URL / IM_REDIS_CLUSTER / IM_MONGO_URL / IM_AMQP_URL in the
// environment are passed on (CI runs against a Redis Cluster that way).

import { spawn } from "node:child_process";
import { createHmac, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root (this file is clients/js/test/nodes.mjs). */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
/** The Python that runs the gateway: $IMGATE_PYTHON, else the repository's .venv. */
export const PYTHON = process.env.IMGATE_PYTHON || resolve(REPO, ".venv/bin/python");
/** The HS256 secret nodes started here verify tokens with (>= 32 bytes). */
export const SECRET = "js-sdk-test-secret-0123456789-abcdefgh";
/** The server API key nodes started here accept (IM_API_KEYS). */
export const API_KEY = "js-sdk-test-api-key-0123456789";

/** Where the shared servers are (the environment's, else gateway/config.py's defaults). */
export function serverUrls(env = process.env) {
  return {
    redisUrl: env.IM_REDIS_URL || "redis://127.0.0.1:6379/0",
    redisCluster: env.IM_REDIS_CLUSTER === "1",
    mongoUrl: env.IM_MONGO_URL || "mongodb://127.0.0.1:27017",
    amqpUrl: env.IM_AMQP_URL || "amqp://guest:guest@127.0.0.1:5672/",
  };
}

/** A fresh IM_NAMESPACE: `prefix` + 10 hex digits. */
export function newNamespace(prefix = "js") {
  return prefix + randomBytes(5).toString("hex");
}

/** Settings the tests want by default: fast heartbeats, quick drains, lifted limits. */
export const TEST_SETTINGS = {
  IM_HEARTBEAT_S: "0.5",
  IM_HEARTBEAT_TTL_S: "1.5",
  IM_DRAIN_TIMEOUT_S: "3",
  IM_PRESENCE_GRACE_S: "1",
  IM_ROOM_REPORT_S: "0.1",
  IM_HTTP_RATE: "0",
  IM_ROOM_SEND_RATE: "0",
};

const READY = /gateway: node (\S+) ws:\/\/([^:/\s]+):(\d+)\/ws http:\/\/[^:/\s]+:(\d+)/;
const live = new Set(); // node processes not known to have exited

function b64url(x) {
  return Buffer.from(typeof x === "string" ? x : JSON.stringify(x)).toString("base64url");
}

/**
 * An HS256 JWT as the gateway expects (gateway/auth.py): `sub`, `iat`, `exp`.
 * `claims` are merged in last (e.g. `{ exp: ... }` to shape a bad one).
 */
export function token(user, { secret = SECRET, ttlS = 3600, claims = {} } = {}) {
  const now = Math.floor(Date.now() / 1000);
  const head = b64url({ alg: "HS256", typ: "JWT" });
  const body = b64url({ sub: user, iat: now, exp: now + ttlS, ...claims });
  const sig = createHmac("sha256", secret).update(`${head}.${body}`).digest("base64url");
  return `${head}.${body}.${sig}`;
}

/**
 * Start one node and wait for its ready line. Options: `namespace` (required),
 * `secret`, `apiKey` (IM_API_KEYS; null for none), `env` (more IM_* settings, over
 * TEST_SETTINGS), `timeoutMs`. Resolves to a handle: `name`, `wsUrl`, `httpUrl`,
 * `pid`, `output()` (the log's tail), `kill(signal)`, `exited` (a promise of
 * `{code, signal}`), `stop(graceMs)` (SIGTERM, SIGKILL after the grace).
 */
export function startNode({ namespace, secret = SECRET, apiKey = API_KEY, env = {}, timeoutMs = 30000 } = {}) {
  if (!namespace) throw new TypeError("namespace is required");
  if (!existsSync(PYTHON)) throw new Error(`no Python at ${PYTHON} (run scripts/setup.sh, or set IMGATE_PYTHON)`);
  const childEnv = {
    ...process.env,
    ...TEST_SETTINGS,
    IM_NAMESPACE: namespace,
    IM_AUTH_SECRET: secret,
    IM_WS_PORT: "0",
    IM_HTTP_PORT: "0",
    IM_METRICS_PORT: "-1",
    IM_NODE_ID: "",
    ...(apiKey ? { IM_API_KEYS: apiKey } : {}),
    ...env,
  };
  const proc = spawn(PYTHON, ["-m", "gateway", "serve"], {
    cwd: REPO,
    env: childEnv,
    stdio: ["ignore", "pipe", "pipe"],
  });
  live.add(proc);
  const lines = [];
  const keep = (chunk) => {
    for (const line of chunk.toString().split("\n")) if (line) lines.push(line);
    if (lines.length > 400) lines.splice(0, lines.length - 400);
  };
  const exited = new Promise((res) => proc.once("exit", (code, signal) => {
    live.delete(proc);
    res({ code, signal });
  }));
  const output = () => lines.join("\n");
  return new Promise((resolveReady, rejectReady) => {
    let buf = "";
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      rejectReady(new Error(`node not ready after ${timeoutMs} ms:\n${output().slice(-2000)}`));
    }, timeoutMs);
    proc.stderr.on("data", keep);
    proc.stdout.on("data", (chunk) => {
      keep(chunk);
      if (buf === null) return;
      buf += chunk.toString();
      const m = READY.exec(buf);
      if (!m) return;
      buf = null;
      clearTimeout(timer);
      const [, name, host, wsPort, httpPort] = m;
      resolveReady({
        name,
        pid: proc.pid,
        wsUrl: `ws://${host}:${wsPort}/ws`,
        httpUrl: `http://${host}:${httpPort}`,
        process: proc,
        exited,
        output,
        kill(signal = "SIGKILL") {
          if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
          return exited;
        },
        async stop(graceMs = 5000) {
          if (proc.exitCode !== null || proc.signalCode !== null) return exited;
          proc.kill("SIGTERM");
          const t = setTimeout(() => proc.kill("SIGKILL"), graceMs);
          const r = await exited;
          clearTimeout(t);
          return r;
        },
      });
    });
    exited.then(({ code, signal }) => {
      if (buf === null) return;
      clearTimeout(timer);
      rejectReady(new Error(`node exited (${code ?? signal}) before it was ready:\n${output().slice(-2000)}`));
    });
  });
}

/** Start `count` nodes of one namespace at once (same options as startNode). */
export function startNodes(count, opts) {
  return Promise.all(Array.from({ length: count }, () => startNode(opts)));
}

/** SIGKILL every node this module started that is still running (e.g. at exit). */
export function killAll() {
  for (const proc of live) proc.kill("SIGKILL");
}
process.once("exit", killAll);
// Interrupted (Ctrl-C, a runner's SIGTERM): no node is left running. Then the
// signal's default action, unless someone else handles it.
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  const onSignal = () => {
    killAll();
    if (process.listenerCount(sig) === 1) {
      process.removeListener(sig, onSignal);
      process.kill(process.pid, sig);
    }
  };
  process.on(sig, onSignal);
}

/**
 * Delete the namespace's Redis keys, Mongo database and RabbitMQ exchanges
 * (testkit/namespace.py's drop_namespace, in a Python child). Resolves to its
 * report; never rejects (a failed cleanup is reported, not thrown).
 */
export function dropNamespace(namespace, { timeoutMs = 60000 } = {}) {
  const s = serverUrls();
  const code = [
    "import asyncio, json, sys",
    "from testkit.namespace import drop_namespace",
    "ns, redis, cluster, mongo, amqp = sys.argv[1:6]",
    "print(json.dumps(asyncio.run(drop_namespace(ns, redis_url=redis, mongo_url=mongo,",
    "    amqp_url=amqp, redis_cluster=cluster == '1', timeout=30)), default=str))",
  ].join("\n");
  return new Promise((res) => {
    const child = spawn(PYTHON, ["-c", code, namespace, s.redisUrl, s.redisCluster ? "1" : "0", s.mongoUrl, s.amqpUrl], {
      cwd: REPO,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (c) => (out += c));
    child.stderr.on("data", (c) => (out += c));
    const t = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.once("exit", (code) => {
      clearTimeout(t);
      try {
        res(code === 0 ? JSON.parse(out.trim().split("\n").pop()) : { failed: out.slice(-1000) });
      } catch {
        res({ failed: out.slice(-1000) });
      }
    });
  });
}

/** A server API call (X-API-Key): `serverApi(node, "POST", "/v1/server/users/u/ban", {seconds: 60})`. */
export async function serverApi(node, method, path, body, apiKey = API_KEY) {
  const res = await fetch(node.httpUrl + path, {
    method,
    headers: { "X-API-Key": apiKey, ...(body !== undefined ? { "Content-Type": "application/json" } : {}) },
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  const data = text ? JSON.parse(text) : null;
  if (!res.ok) throw Object.assign(new Error(`${method} ${path}: ${res.status} ${text}`), { status: res.status, body: data });
  return data;
}

/**
 * Wait until every node routes to every other: for each ordered pair, a message
 * from a fresh user on one reaches a fresh user on the other as a push (a node
 * that has not yet seen another's heartbeat drops the route instead). Needs a
 * global WebSocket (node --experimental-websocket) or `WebSocket` passed in.
 */
export async function settle(nodes, { WebSocket = globalThis.WebSocket, secret = SECRET, timeoutMs = 15000 } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (const from of nodes) {
    for (const to of nodes) {
      if (from === to) continue;
      for (let attempt = 0; ; attempt++) {
        if (Date.now() > deadline) throw new Error(`nodes did not settle in ${timeoutMs} ms`);
        const tag = randomBytes(4).toString("hex");
        const [a, b] = [`settleA${tag}`, `settleB${tag}`];
        const wa = await openRaw(WebSocket, `${from.wsUrl}?token=${token(a, { secret })}`);
        const wb = await openRaw(WebSocket, `${to.wsUrl}?token=${token(b, { secret })}`);
        try {
          const got = new Promise((res) => {
            wb.onmessage = (ev) => JSON.parse(ev.data).op === "msg" && res(true);
            setTimeout(() => res(false), 500);
          });
          wa.send(JSON.stringify({ op: "send", id: 1, to: b, cmid: "settle", body: "ping" }));
          if (await got) break;
        } finally {
          wa.close();
          wb.close();
        }
      }
    }
  }
}

function openRaw(WebSocket, url) {
  return new Promise((res, rej) => {
    const ws = new WebSocket(url);
    ws.onopen = () => res(ws);
    ws.onerror = () => rej(new Error(`cannot open ${url.split("?")[0]}`));
  });
}
