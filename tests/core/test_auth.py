"""Tokens and the secret, without servers: lifetime, exp/iat/nbf types, leeway,
the local secret file, the settings that guard them."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path

import jwt
import pytest

from gateway.auth import (
    TokenVerifier,
    check_times,
    issue_token,
    load_secret,
    secret_path,
    verify_token,
    with_secret,
)
from gateway.config import ConfigError, Settings
from gateway.errors import ProtocolError

SECRET = "s" * 40
NOW = 1_800_000_000.0
DAY = 86_400
OLD_DEV_SECRET = "dev-only-secret-change-me-0123456789"


def signed(claims: dict, secret: str = SECRET) -> str:
    return jwt.encode(claims, secret, "HS256")


def refused(token: str | None, now: float = NOW, **kw) -> str:
    with pytest.raises(ProtocolError) as info:
        verify_token(SECRET, token, now=now, **kw)
    assert info.value.code == "unauthorized"
    return info.value.message


def test_a_fresh_token_is_accepted():
    assert verify_token(SECRET, signed({"sub": "alice", "iat": NOW, "exp": NOW + 60}),
                        now=NOW) == "alice"
    assert verify_token(SECRET, issue_token(SECRET, "bob", 60)) == "bob"


@pytest.mark.parametrize("claims", [
    {"sub": "a", "exp": "1800000060"},          # a string
    {"sub": "a", "exp": True},                  # a boolean is no number
    {"sub": "a", "exp": NOW + 60, "iat": "x"},
    {"sub": "a", "exp": NOW + 60, "iat": None},
    {"sub": "a", "exp": NOW + 60, "nbf": [1]},
])
def test_time_claims_must_be_numbers(claims):
    assert "must be a number" in refused(signed(claims))


@pytest.mark.parametrize("exp", [1e300, 16_725_225_600, NOW + 31 * DAY])  # 1e300, 2500, 31 d
def test_lifetime_over_the_maximum_is_refused(exp):
    assert "lifetime" in refused(signed({"sub": "a", "exp": exp}))
    assert "lifetime" in refused(signed({"sub": "a", "iat": NOW, "exp": exp}))


def test_lifetime_is_judged_by_exp_minus_iat_and_exp_minus_now():
    # Issued 20 days ago for 40 days: 20 days left, but its lifetime is 40.
    assert "lifetime" in refused(signed({"sub": "a", "iat": NOW - 20 * DAY,
                                         "exp": NOW + 20 * DAY}))
    # Exactly the maximum is fine; without iat, exp - now decides.
    assert verify_token(SECRET, signed({"sub": "a", "iat": NOW, "exp": NOW + 30 * DAY}),
                        now=NOW) == "a"
    assert verify_token(SECRET, signed({"sub": "a", "exp": NOW + 30 * DAY}), now=NOW) == "a"
    # A smaller configured maximum.
    assert "lifetime" in refused(signed({"sub": "a", "exp": NOW + 7200}), max_ttl_s=3600)


def test_leeway_covers_an_issuer_clock_ahead_but_never_extends_exp():
    ahead = signed({"sub": "a", "iat": NOW + 20, "nbf": NOW + 20, "exp": NOW + 30 * DAY + 20})
    assert verify_token(SECRET, ahead, now=NOW) == "a"  # within the default 30 s
    assert "lifetime" in refused(ahead, leeway_s=5)  # 20 s past the maximum, 5 s allowed
    assert "future" in refused(signed({"sub": "a", "iat": NOW + 20, "exp": NOW + 80}),
                               leeway_s=5)
    assert "not valid yet" in refused(signed({"sub": "a", "nbf": NOW + 60, "exp": NOW + 120}))
    assert "expired" in refused(signed({"sub": "a", "exp": NOW - 1}))
    assert "expired" in refused(signed({"sub": "a", "exp": NOW}))


def test_check_times_is_pure():
    check_times({"exp": NOW + 10}, NOW, 60, 0)
    with pytest.raises(ProtocolError):
        check_times({"exp": NOW + 10}, NOW + 10, 60, 0)
    with pytest.raises(ProtocolError):
        check_times({}, NOW, 60, 0)


@pytest.mark.parametrize("sub", ["g:team", "a b", "", "x" * 65, 7, "été"])
def test_subject_must_be_a_user_id(sub):
    refused(signed({"sub": sub, "exp": NOW + 60}))


def test_no_usable_secret_verifies_nothing():
    tok = signed({"sub": "a", "exp": NOW + 60}, OLD_DEV_SECRET)
    for secret in ("", OLD_DEV_SECRET, "short"):
        with pytest.raises(ProtocolError):
            TokenVerifier(secret).verify(tok, NOW)


def test_issue_token_refuses_what_would_not_verify():
    with pytest.raises(ValueError, match="IM_AUTH_MAX_TTL_S"):
        issue_token(SECRET, "alice", 31 * DAY)
    with pytest.raises(ValueError, match="IM_AUTH_MAX_TTL_S"):
        issue_token(SECRET, "alice", 7200, max_ttl_s=3600)
    with pytest.raises(ValueError, match="g:"):
        issue_token(SECRET, "g:team")
    for secret in ("", OLD_DEV_SECRET):
        with pytest.raises(ValueError, match="secret"):
            issue_token(secret, "alice")


def test_verifier_from_settings():
    s = Settings.from_env({}, auth_secret=SECRET, auth_max_ttl_s=3600, auth_leeway_s=0)
    v = TokenVerifier.from_settings(s)
    assert (v.secret, v.max_ttl_s, v.leeway_s) == (SECRET, 3600, 0)


# -- the secret file -----------------------------------------------------------------
def test_secret_file_is_made_once_private_and_reused(tmp_path):
    path = tmp_path / "state" / "imgate" / "auth_secret"
    first = load_secret(path)
    assert len(first.encode()) >= 32 and first != OLD_DEV_SECRET
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_secret(path) == first
    assert [p.name for p in path.parent.iterdir()] == ["auth_secret"]  # no temp file left


def test_nodes_starting_together_agree_on_one_secret(tmp_path):
    path = tmp_path / "auth_secret"
    code = "import sys; from pathlib import Path; from gateway.auth import load_secret; " \
           "print(load_secret(Path(sys.argv[1])))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                              text=True) for _ in range(8)]
    outs = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(outs) == 1 and outs == {path.read_text().strip()}


async def test_concurrent_loads_in_one_process_agree(tmp_path):
    path = tmp_path / "auth_secret"
    secrets = await asyncio.gather(*(asyncio.to_thread(load_secret, path) for _ in range(16)))
    assert len(set(secrets)) == 1


def test_a_secret_file_others_can_read_is_refused(tmp_path):
    from gateway.auth import SecretError
    path = tmp_path / "auth_secret"
    load_secret(path)
    os.chmod(path, 0o644)
    with pytest.raises(SecretError, match="chmod 600"):
        load_secret(path)
    os.chmod(path, 0o600)
    path.write_text("short\n")
    with pytest.raises(SecretError, match="no usable secret"):
        load_secret(path)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SecretError):
        load_secret(path)


def test_with_secret_prefers_the_configured_one(tmp_path):
    configured = Settings.from_env({}, auth_secret=SECRET)
    assert with_secret(configured) == (configured, None)
    file = str(tmp_path / "secret")
    s, path = with_secret(Settings.from_env({"IM_AUTH_SECRET_FILE": file}))
    assert path == Path(file) and s.auth_secret == Path(file).read_text().strip()


def test_default_secret_path_follows_xdg_state_home():
    s = Settings.from_env({})
    assert secret_path(s, {"XDG_STATE_HOME": "/st"}) == Path("/st/imgate/auth_secret")
    assert secret_path(s, {}).parts[-4:] == (".local", "state", "imgate", "auth_secret")


# -- settings ------------------------------------------------------------------------
@pytest.mark.parametrize("env", [
    {"IM_ENV": "production"},                              # no secret in production
    {"IM_ENV": "prod"},                                    # a typo is not development
    {"IM_AUTH_SECRET": OLD_DEV_SECRET},                    # the published value
    {"IM_AUTH_MAX_TTL_S": "0"}, {"IM_AUTH_LEEWAY_S": "-1"},
    {"IM_HTTP_HEADER_TIMEOUT_S": "0"}, {"IM_HTTP_BODY_TIMEOUT_S": "0"},
    {"IM_HTTP_BODY_MAX": "0"}, {"IM_HTTP_RATE": "-1"}, {"IM_HTTP_BURST": "0"},
    {"IM_FEED_FOLLOW_MAX": "0"}, {"IM_MAX_CONNS_PER_USER": "0"},
    {"IM_METRICS_PORT": "-2"}, {"IM_METRICS_PORT": "70000"}, {"IM_METRICS_PUBLIC": "2"},
])
def test_bad_edge_settings_are_refused(env):
    with pytest.raises(ConfigError):
        Settings.from_env(env)


def test_edge_defaults():
    s = Settings.from_env({})
    assert s.auth_secret == "" and s.env == "development"
    assert (s.auth_max_ttl_s, s.auth_leeway_s) == (30 * DAY, 30)
    assert (s.http_header_timeout_s, s.http_body_timeout_s, s.http_body_max) == (10, 30, 65536)
    assert (s.http_rate, s.http_burst, s.feed_follow_max, s.max_conns_per_user) == (
        50, 100, 2000, 10)
    assert (s.metrics_host, s.metrics_port, s.metrics_public) == ("127.0.0.1", 9464, 0)
    assert Settings.from_env({"IM_ENV": "production", "IM_AUTH_SECRET": SECRET}).env == \
        "production"


def _outcome(verifier: TokenVerifier, token: str) -> tuple[str, object]:
    try:
        t = verifier.check(token, now=NOW)
    except ProtocolError as err:
        return ("refused", err.message)
    return ("ok", (t.user, t.exp, t.iat, t.device, t.platform))


def _b64(data: bytes) -> str:
    return jwt.utils.base64url_encode(data).decode()


FAST_PATH_CASES = [
    signed({"sub": "alice", "exp": NOW + 60}),
    signed({"sub": "alice", "exp": NOW + 60, "iat": NOW, "device": "d1", "platform": "ios"}),
    signed({"sub": "alice", "exp": NOW + 60}, secret="t" * 40),  # another secret
    signed({"sub": "alice"}),  # no exp
    signed({"exp": NOW + 60}),  # no sub
    signed({"sub": None, "exp": NOW + 60}),
    signed({"sub": 7, "exp": NOW + 60}),
    signed({"sub": "alice", "exp": NOW + 60, "jti": 5}),
    signed({"sub": "alice", "exp": "soon"}),
    signed({"sub": "alice", "exp": NOW - 60}),  # expired
    signed({"sub": "g:x", "exp": NOW + 60}),
    jwt.encode({"sub": "alice", "exp": NOW + 60}, SECRET, "HS256", headers={"kid": "k1"}),
    jwt.encode({"sub": "alice", "exp": NOW + 60}, SECRET, "HS384"),
    jwt.encode({"sub": "alice", "exp": NOW + 60}, None, "none"),  # type: ignore[arg-type]
    signed({"sub": "alice", "exp": NOW + 60})[:-3] + "AAA",  # signature altered
    signed({"sub": "alice", "exp": NOW + 60}) + ".x",  # a fourth segment
    "not-a-token", "a.b", "..", "a.b.c",
    _b64(b'{"alg":"HS256"}') + "." + _b64(b"[1,2]") + ".sig",
    _b64(b"[]") + "." + _b64(b"{}") + "." + _b64(b"x"),
]


@pytest.mark.parametrize("token", FAST_PATH_CASES)
def test_the_hs256_fast_path_decides_as_pyjwt_does(token):
    fast = TokenVerifier(SECRET)
    slow = TokenVerifier(SECRET)
    object.__setattr__(slow, "_mac", None)  # every token through PyJWT
    assert fast.__dict__["_mac"] is not None
    assert _outcome(fast, token) == _outcome(slow, token)


def test_the_signature_of_a_payload_the_fast_path_reads_must_hold():
    """A forged payload under a valid header is refused (the HMAC covers both)."""
    good = signed({"sub": "alice", "exp": NOW + 60})
    head, _, sig = good.split(".")
    body = _b64(b'{"sub":"mallory","exp":1900000000}')
    forged = f"{head}.{body}.{sig}"
    assert _outcome(TokenVerifier(SECRET), forged) == ("refused", "token is invalid")


def test_issuer_or_audience_settings_leave_every_token_to_pyjwt():
    assert TokenVerifier(SECRET, issuer="me").__dict__["_mac"] is None
    assert TokenVerifier(SECRET, audience="app").__dict__["_mac"] is None
    assert TokenVerifier("short").__dict__["_mac"] is None
