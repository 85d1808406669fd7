// One HTTP API call: JSON in and out, the bearer token, a timeout.

import { ImError } from "./util.js";

/**
 * `method` `base + path` with `Authorization: Bearer token`; the parsed JSON answer.
 * Non-2xx: ImError with `.status`, `.code` (the API's `error.code`) and `.body`;
 * a network failure or timeout: ImError with `.status` 0.
 */
export async function httpJson(fetchFn, base, method, path, body, token, timeoutMs) {
  if (!fetchFn) throw new ImError("http", "no fetch: pass one");
  const url = base + (path.startsWith("/") ? path : "/" + path);
  const headers = { Authorization: `Bearer ${token}` };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const ctl = typeof AbortController === "function" && timeoutMs > 0 ? new AbortController() : null;
  const timer = ctl && setTimeout(() => ctl.abort(), timeoutMs);
  if (ctl) init.signal = ctl.signal;
  let res, text;
  try {
    res = await fetchFn(url, init);
    text = await res.text();
  } catch (err) {
    const code = ctl && ctl.signal.aborted ? "timeout" : "http";
    throw new ImError(code, `${method} ${path}: ${err && err.message}`, { status: 0, cause: err });
  } finally {
    clearTimeout(timer);
  }
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!res.ok) {
    const e = data && data.error ? data.error : {};
    throw new ImError(e.code || "http", e.message || `${method} ${path}: HTTP ${res.status}`, {
      status: res.status,
      body: data,
    });
  }
  return data;
}
