"""Tokens signed with a public-key algorithm (RS256, ES256), ``iss`` / ``aud``,
and the key file, without servers."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.auth import SecretError, Token, TokenVerifier, load_public_key
from gateway.errors import ProtocolError

SECRET = "s" * 40
NOW = 1_800_000_000.0


def pem(key: object) -> str:
    return key.public_key().public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC = ec.generate_private_key(ec.SECP256R1())


def claims(**extra: object) -> dict[str, object]:
    return {"sub": "alice", "iat": int(NOW) - 10, "exp": int(NOW) + 600, **extra}


def refused(v: TokenVerifier, token: str) -> str:
    with pytest.raises(ProtocolError) as info:
        v.check(token, now=NOW)
    assert info.value.code == "unauthorized"
    return info.value.message


@pytest.mark.parametrize(("key", "alg"), [(RSA, "RS256"), (EC, "ES256")])
def test_public_key_tokens_verify_and_say_when_they_expire(key, alg):
    v = TokenVerifier(SECRET, public_key=pem(key))
    token = jwt.encode(claims(), key, alg)
    assert v.check(token, now=NOW) == Token("alice", NOW + 600, NOW - 10)
    # HS256 tokens still verify with the secret beside the key.
    assert v.verify(jwt.encode(claims(), SECRET, "HS256"), now=NOW) == "alice"


def test_the_algorithm_picks_its_key_never_the_other():
    v = TokenVerifier(SECRET, public_key=pem(RSA))
    # Signed by another RSA key: refused.
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert refused(v, jwt.encode(claims(), other, "RS256")) == "token is invalid"
    # An HS256 token whose HMAC key is the public key (the classic confusion):
    # HS256 is checked with the secret only.
    head = _b64(b'{"alg":"HS256","typ":"JWT"}')
    body = _b64(b'{"sub":"alice","iat":1799999990,"exp":1800000600}')
    sig = hmac.new(pem(RSA).encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    assert refused(v, f"{head}.{body}.{_b64(sig)}") == "token is invalid"
    # No public key configured: RS256 refused outright, whatever it says.
    assert refused(TokenVerifier(SECRET), jwt.encode(claims(), RSA, "RS256")) == \
        "token is invalid"
    assert refused(v, jwt.encode(claims(), "k" * 64, "HS384")) == "token is invalid"
    assert refused(v, "not-a-jwt") == "token is invalid"


def test_issuer_and_audience_are_required_when_set():
    v = TokenVerifier(SECRET, issuer="https://id.example", audience="imgate")
    ok = jwt.encode(claims(iss="https://id.example", aud="imgate"), SECRET, "HS256")
    assert v.verify(ok, now=NOW) == "alice"
    assert v.verify(jwt.encode(claims(iss="https://id.example", aud=["x", "imgate"]), SECRET,
                               "HS256"), now=NOW) == "alice"
    for bad, why in ((claims(iss="https://evil", aud="imgate"), "issuer"),
                     (claims(aud="imgate"), "issuer"),
                     (claims(iss="https://id.example", aud="other"), "audience"),
                     (claims(iss="https://id.example"), "audience")):
        assert refused(v, jwt.encode(bad, SECRET, "HS256")) == f"token {why} is not accepted"
    # Not configured: iss and aud are not looked at.
    assert TokenVerifier(SECRET).verify(
        jwt.encode(claims(iss="any", aud="any"), SECRET, "HS256"), now=NOW) == "alice"


def test_the_key_file_must_hold_an_rsa_or_ec_public_key(tmp_path: Path):
    good = tmp_path / "key.pem"
    good.write_text(pem(EC))
    assert load_public_key(str(good)) == pem(EC)
    assert load_public_key("") == ""
    bad = tmp_path / "bad.pem"
    bad.write_text("hello")
    with pytest.raises(SecretError, match="holds no PEM public key"):
        load_public_key(str(bad))
    with pytest.raises(SecretError, match="cannot read"):
        load_public_key(str(tmp_path / "missing.pem"))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
