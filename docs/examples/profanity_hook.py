"""An example hook server for imgate (docs/protocol.md, "Hooks"): a profanity
filter and a spam rule, in the standard library only.

    IM_HOOK_SECRET=change-me-0123456789 python docs/examples/profanity_hook.py --port 9000

and run the node with ``IM_HOOK_URL=http://127.0.0.1:9000/hook
IM_HOOK_SECRET=change-me-0123456789`` (``IM_HOOKS=send,room_send`` to filter
live rooms too). A message containing a listed word is stored and delivered
with the word starred out; one containing a link to a listed domain is
rejected, and its sender sees the message below. Every request's signature
is checked: a request without the right one gets 401.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = re.compile(r"\b(darn|heck|frak)\b", re.IGNORECASE)
SPAM = re.compile(r"https?://(\S+\.)?(spam\.example|cheap-pills\.example)\b", re.IGNORECASE)
SECRET = os.environ.get("IM_HOOK_SECRET", "").encode()


def signed(headers: dict[str, str], body: bytes) -> bool:
    """X-Imgate-Signature = sha256= hex HMAC-SHA256(secret, "{timestamp}." + body)."""
    ts = headers.get("X-Imgate-Timestamp", "")
    if not ts.isdigit() or abs(time.time() - int(ts)) > 300:
        return False
    mac = hmac.new(SECRET, f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest("sha256=" + mac, headers.get("X-Imgate-Signature", ""))


def decide(call: dict[str, object]) -> dict[str, object]:
    body = call.get("body")
    if not isinstance(body, str):  # a join, or a structured body: allowed as is
        return {"action": "allow"}
    if SPAM.search(body):
        return {"action": "reject", "message": "links to that site are not allowed"}
    clean = WORDS.sub(lambda m: "*" * len(m.group(0)), body)
    return {"action": "allow", "body": clean} if clean != body else {"action": "allow"}


class Hook(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the node pools its connections

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not signed(dict(self.headers), body):
            self._answer(401, {"error": "bad signature"})
            return
        self._answer(200, decide(json.loads(body)))

    def _answer(self, status: int, answer: dict[str, object]) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:  # quiet: one line per call is noise
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=9000)
    args = p.parse_args()
    if len(SECRET) < 16:
        raise SystemExit("set IM_HOOK_SECRET (at least 16 bytes), the same as the node's")
    print(f"profanity hook on http://127.0.0.1:{args.port}/hook", flush=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), Hook).serve_forever()


if __name__ == "__main__":
    main()
