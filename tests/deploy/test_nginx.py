"""deploy/nginx.conf, the edge: tokens stay out of the access log, /metrics and
the API's description are not served to the public, port 80 only redirects,
TLS on 443, and the upstreams follow `docker compose up --scale gateway=N`.

The file is parsed here (a small reader of nginx's syntax) and requests are
routed through its `location` blocks the way nginx picks one."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.deploy.conftest import REPO

CONF = REPO / "deploy" / "nginx.conf"
# Variables that carry the query string (?token=...) or a URL that may.
QUERY_VARS = {"request", "request_uri", "args", "query_string", "is_args", "http_referer",
              "request_line", "request_body"}
HIDDEN = ["/metrics", "/openapi.json", "/docs", "/docs/", "/docs/oauth2-redirect", "/redoc"]
ERROR_LEVELS = ["debug", "info", "notice", "warn", "error", "crit", "alert", "emerg"]


@dataclass
class Directive:
    name: str
    args: list[str]
    children: list[Directive] = field(default_factory=list)

    def all(self, name: str) -> list[Directive]:
        return [d for d in self.children if d.name == name]

    def one(self, name: str) -> Directive:
        (found,) = self.all(name)
        return found

    def walk(self) -> list[Directive]:
        return [d for c in self.children for d in (c, *c.walk())]


TOKEN = re.compile(r'"((?:\\.|[^"\\])*)"'  # "quoted"
                   r"|'((?:\\.|[^'\\])*)'"  # 'quoted'
                   r"|#[^\n]*"  # a comment
                   r"|[{};]|[^\s{};\"'#]+")


def tokens(text: str) -> list[str]:
    out = []
    for m in TOKEN.finditer(text):
        if m.group(0).startswith("#"):
            continue
        quoted = m.group(1) if m.group(1) is not None else m.group(2)
        out.append(quoted if quoted is not None else m.group(0))
    return out


def parse(text: str) -> Directive:
    root = Directive("main", [])
    stack, words = [root], list[str]()
    for tok in tokens(text):
        if tok == ";":
            stack[-1].children.append(Directive(words[0], words[1:]))
            words = []
        elif tok == "{":
            block = Directive(words[0], words[1:])
            stack[-1].children.append(block)
            stack.append(block)
            words = []
        elif tok == "}":
            assert not words, f"unterminated directive {words}"
            stack.pop()
        else:
            words.append(tok)
    assert len(stack) == 1 and not words, "unbalanced braces"
    return root


@pytest.fixture(scope="module")
def conf() -> Directive:
    return parse(CONF.read_text())


def http(conf: Directive) -> Directive:
    return conf.one("http")


def server_on(conf: Directive, port: str) -> Directive:
    (found,) = [s for s in http(conf).all("server")
                if any(d.args[0] == port for d in s.all("listen"))]
    return found


def location_for(server: Directive, path: str) -> Directive:
    """The location nginx picks for ``path``: an exact match, else the longest
    prefix, unless a regex matches and that prefix is not ``^~``."""
    exact, prefixes, regexes = [], [], []
    for loc in server.all("location"):
        if loc.args[0] == "=":
            exact.append(loc)
        elif loc.args[0] == "^~" or len(loc.args) == 1:
            prefixes.append(loc)
        else:
            regexes.append(loc)
    for loc in exact:
        if loc.args[1] == path:
            return loc
    matching = [loc for loc in prefixes if path.startswith(loc.args[-1])]
    best = max(matching, key=lambda loc: len(loc.args[-1]), default=None)
    if best is None or best.args[0] != "^~":
        for loc in regexes:
            flags = re.I if loc.args[0] == "~*" else 0
            if re.search(loc.args[1], path, flags):
                return loc
    assert best is not None, f"no location for {path}"
    return best


def variables(fmt: str) -> set[str]:
    return set(re.findall(r"\$\{?([A-Za-z0-9_]+)", fmt))


def upstream(conf: Directive, name: str) -> Directive:
    (found,) = [u for u in http(conf).all("upstream") if u.args == [name]]
    return found


# -- logs ----------------------------------------------------------------------------------
def test_access_log_has_no_query_string(conf: Directive) -> None:
    formats = {d.args[0]: " ".join(d.args[1:]) for d in conf.walk() if d.name == "log_format"}
    logs = [d for d in conf.walk() if d.name == "access_log"]
    assert logs
    for log in logs:
        if log.args == ["off"]:
            continue
        # no format named: nginx's "combined", whose $request has the query string
        assert len(log.args) >= 2 and log.args[1] in formats, log.args
        used = variables(formats[log.args[1]])
        assert "uri" in used
        assert not used & QUERY_VARS, used & QUERY_VARS
        assert not {v for v in used if v.startswith(("arg_", "cookie_", "http_authorization"))}
    # the referrer is logged cut at its "?"
    referer_map = [d for d in http(conf).all("map") if d.args == ["$http_referer",
                                                                   "$referer_path"]]
    assert referer_map and referer_map[0].one("~^(?<path>[^?]*)").args == ["$path"]


def test_websocket_errors_do_not_log_tokens(conf: Directive) -> None:
    # nginx's error lines quote the request line (with ?token=): under crit only.
    ws = location_for(server_on(conf, "443"), "/ws")
    (level,) = [d.args[1] for d in ws.all("error_log")]
    assert ERROR_LEVELS.index(level) >= ERROR_LEVELS.index("crit")
    assert ws.one("proxy_pass").args == ["http://im_ws"]


# -- what the public reaches ---------------------------------------------------------------
@pytest.mark.parametrize("path", HIDDEN)
def test_hidden_paths_are_not_proxied(conf: Directive, path: str) -> None:
    loc = location_for(server_on(conf, "443"), path)
    assert not loc.all("proxy_pass"), f"{path} is proxied by location {loc.args}"
    assert loc.one("return").args == ["404"]


@pytest.mark.parametrize(("path", "target"), [
    ("/ws", "http://im_ws"), ("/v1/sync", "http://im_http"), ("/healthz", "http://im_http"),
    ("/v1/server/send", "http://im_http"), ("/", "http://im_http"),
])
def test_api_and_websocket_are_proxied(conf: Directive, path: str, target: str) -> None:
    assert location_for(server_on(conf, "443"), path).one("proxy_pass").args == [target]


def test_port_80_only_redirects_to_https(conf: Directive) -> None:
    plain = server_on(conf, "80")
    for loc in plain.all("location"):
        assert not loc.all("proxy_pass")
        code, target = loc.one("return").args
        assert code in ("301", "308") and target.startswith("https://")
    assert not [d for d in plain.walk() if d.name == "proxy_pass"]


def test_tls_on_443(conf: Directive, configs: dict[str, dict[str, Any]]) -> None:
    tls = server_on(conf, "443")
    assert "ssl" in tls.one("listen").args
    assert tls.one("ssl_protocols").args == ["TLSv1.2", "TLSv1.3"]
    files = [tls.one("ssl_certificate").args[0], tls.one("ssl_certificate_key").args[0]]
    assert files == ["/etc/nginx/tls/fullchain.pem", "/etc/nginx/tls/privkey.pem"]
    edge = configs["default"]["services"]["edge"]
    assert "/etc/nginx/tls" in {m["target"] for m in edge["volumes"]}
    script = (REPO / "scripts" / "selfsigned_cert.sh").read_text()
    assert '-keyout "$DIR/privkey.pem" -out "$DIR/fullchain.pem"' in script
    assert "deploy/tls/" in (REPO / ".gitignore").read_text().split()


# -- the gateways behind it ----------------------------------------------------------------
def test_upstreams_follow_the_scaled_service(conf: Directive,
                                             configs: dict[str, dict[str, Any]]) -> None:
    assert http(conf).one("resolver").args[0] == "127.0.0.11"  # Docker's embedded DNS
    assert any(a.startswith("valid=") for a in http(conf).one("resolver").args)
    env = configs["default"]["services"]["gateway"]["environment"]
    for name, port in (("im_ws", env["IM_WS_PORT"]), ("im_http", env["IM_HTTP_PORT"])):
        up = upstream(conf, name)
        assert up.all("zone"), name  # `resolve` needs the shared zone
        (server,) = up.all("server")
        assert server.args[0] == f"gateway:{port}", server.args
        assert "resolve" in server.args[1:], f"{name}: resolved once at start only"
    assert upstream(conf, "im_ws").all("least_conn")  # long-lived sockets
