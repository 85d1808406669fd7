// Small helpers of the imgate client: no I/O, no dependencies.

/** An Error with the protocol's `code` (and `status` for HTTP answers). */
export class ImError extends Error {
  /**
   * @param {string} code  protocol error code (`bad_request`, `forbidden`, ...) or one of the
   *                       client's own (`stopped`, `disconnected`, `timeout`, `offline`, `http`)
   * @param {string} message
   * @param {object} [extra]  copied onto the error (`status`, `frame`, `cmid`, ...)
   */
  constructor(code, message, extra) {
    super(message || code);
    this.name = "ImError";
    this.code = code;
    if (extra) Object.assign(this, extra);
  }
}

/**
 * A Set that keeps at most `max` values: adding past it forgets the oldest added.
 * `onEvict(value)` is told about each value forgotten.
 */
export class BoundedSet {
  constructor(max, onEvict) {
    this.max = Math.max(1, max | 0);
    this.onEvict = onEvict;
    this.set = new Set();
  }

  has(v) {
    return this.set.has(v);
  }

  /** Adds `v`; false if it was there already. */
  add(v) {
    if (this.set.has(v)) return false;
    this.set.add(v);
    while (this.set.size > this.max) {
      const oldest = this.set.values().next().value;
      this.set.delete(oldest);
      if (this.onEvict) this.onEvict(oldest);
    }
    return true;
  }

  clear() {
    this.set.clear();
  }

  get size() {
    return this.set.size;
  }
}

/** Full-jitter exponential backoff: a random delay in [0, min(maxMs, minMs * 2^attempt)). */
export function backoffDelay(attempt, { minMs = 200, maxMs = 10000 } = {}, random = Math.random) {
  const cap = Math.min(maxMs, minMs * 2 ** Math.min(attempt, 30));
  return Math.floor(random() * cap);
}

function base64UrlDecode(s) {
  const b64 = s.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((s.length + 3) % 4);
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new TextDecoder().decode(bytes);
}

/** The claims of a JWT (not verified: only to read `sub`, `exp`, `iat`); null if unreadable. */
export function jwtClaims(token) {
  if (typeof token !== "string") return null;
  const parts = token.split(".");
  if (parts.length !== 3) return null;
  try {
    const claims = JSON.parse(base64UrlDecode(parts[1]));
    return claims && typeof claims === "object" ? claims : null;
  } catch {
    return null;
  }
}

/** 16 random hex digits (crypto.getRandomValues where there is one). */
export function randomHex() {
  const bytes = new Uint8Array(8);
  if (globalThis.crypto && globalThis.crypto.getRandomValues) {
    globalThis.crypto.getRandomValues(bytes);
  } else {
    for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(Math.random() * 256);
  }
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** `url` with `?token=` (or `&token=`) appended. */
export function withToken(url, token) {
  if (!token) return url;
  return url + (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token);
}

/** A frame's text: a string as is; bytes (ArrayBuffer, typed array, Node Buffer) decoded. */
export function frameText(data) {
  if (typeof data === "string") return data;
  if (data instanceof ArrayBuffer || ArrayBuffer.isView(data)) return new TextDecoder().decode(data);
  return String(data);
}

/** Minimal event emitter: a throwing listener is logged, never breaks the client. */
export class Emitter {
  constructor() {
    this._listeners = new Map();
  }

  on(event, fn) {
    if (typeof fn !== "function") throw new TypeError("listener must be a function");
    let set = this._listeners.get(event);
    if (!set) this._listeners.set(event, (set = new Set()));
    set.add(fn);
    return this;
  }

  off(event, fn) {
    const set = this._listeners.get(event);
    if (set) set.delete(fn);
    return this;
  }

  once(event, fn) {
    const wrap = (arg) => {
      this.off(event, wrap);
      fn(arg);
    };
    return this.on(event, wrap);
  }

  emit(event, arg) {
    const set = this._listeners.get(event);
    if (!set || set.size === 0) return false;
    for (const fn of [...set]) {
      try {
        fn(arg);
      } catch (err) {
        console.error(`imgate: a "${event}" listener threw`, err);
      }
    }
    return true;
  }
}

/** The handshake's ?device=&platform= (the login policy), when the application named them. */
export function withDevice(url, device, platform) {
  let out = url;
  for (const [k, v] of [["device", device], ["platform", platform]]) {
    if (v) out += `${out.includes("?") ? "&" : "?"}${k}=${encodeURIComponent(v)}`;
  }
  return out;
}
