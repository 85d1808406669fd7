"""Tokens: JWT signed HS256 with the secret, or RS256 / ES256 with a public key
(``IM_AUTH_PUBLIC_KEY_FILE``); ``sub`` is the user id (docs/protocol.md, Tokens).

A token is refused unless its signature holds, ``sub`` is a user id (the id
charset, not starting with ``g:``: those name groups), ``exp`` is a number
in the future and ``exp`` lies at most ``IM_AUTH_MAX_TTL_S`` ahead of both
now and ``iat``; ``iat`` and ``nbf``, when present, must be numbers and not
in the future. ``IM_AUTH_LEEWAY_S`` of clock skew is allowed on ``iat``,
``nbf`` and the lifetime bound, never past ``exp``.
The time checks are ``check_times`` (pure, the clock passed in). With
``IM_AUTH_ISSUER`` / ``IM_AUTH_AUDIENCE`` the token must name that ``iss`` /
carry that ``aud``. The algorithm a token names picks the key: HS256 the
secret, RS256 / ES256 the public key (never the other way round).

The secret: ``IM_AUTH_SECRET``, or else a random one kept in a file only
its user can read (``load_secret``), so a node is never on a public default.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jwt
from jwt.utils import base64url_decode

from core.devices import DeviceError, check_device
from gateway.config import PUBLIC_SECRETS, Settings
from gateway.errors import ProtocolError
from gateway.protocol import ID_PATTERN

__all__ = [
    "DEFAULT_LEEWAY_S",
    "DEFAULT_MAX_TTL_S",
    "SecretError",
    "Token",
    "TokenVerifier",
    "bearer_token",
    "check_times",
    "check_user_id",
    "issue_token",
    "load_public_key",
    "load_secret",
    "secret_path",
    "verify_token",
    "with_secret",
]

ALGORITHM = "HS256"
PUBLIC_ALGORITHMS = ("RS256", "ES256")
DEFAULT_MAX_TTL_S = 30 * 86_400
DEFAULT_LEEWAY_S = 30
GROUP_PREFIX = "g:"
_MIN_SECRET = 32  # bytes (RFC 7518 3.2: a key at least the size of the hash)
# Checked by PyJWT (signature, presence of exp and sub), the rest by check_times.
_DECODE_OPTIONS: Any = {"require": ["exp", "sub"], "verify_exp": False, "verify_iat": False,
                        "verify_nbf": False}


def _refuse(message: str) -> ProtocolError:
    return ProtocolError("unauthorized", message)


def check_user_id(user: object) -> str | None:
    """Why ``user`` is not a user id, or None if it is one."""
    if not isinstance(user, str) or not ID_PATTERN.fullmatch(user):
        return "a user id is 1-64 characters of [A-Za-z0-9_.:-]"
    if user.startswith(GROUP_PREFIX):
        return "a user id may not start with 'g:' (that names a group)"
    return None


# -- time claims (pure) -----------------------------------------------------------
def _number(claims: Mapping[str, Any], name: str) -> float | None:
    """The claim as a finite number, None if absent; refused if anything else
    (a string, a boolean, null, an infinity)."""
    if name not in claims:
        return None
    value = claims[name]
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value)):
        raise _refuse(f"token claim {name} must be a number")
    return float(value)


def check_times(claims: Mapping[str, Any], now: float, max_ttl_s: float,
                leeway_s: float) -> None:
    """Refuse a token that has expired, is not valid yet, or lives longer than
    ``max_ttl_s`` (``exp - iat``, and ``exp - now`` for tokens with or without
    ``iat``). ``leeway_s`` allows for an issuer whose clock is ahead of ours
    (``iat``/``nbf`` a little in the future, ``exp`` a little further out);
    ``exp`` itself is never extended: an expired token is refused at once."""
    exp = _number(claims, "exp")
    iat = _number(claims, "iat")
    nbf = _number(claims, "nbf")
    if exp is None:
        raise _refuse("token claim exp is required")
    if exp <= now:
        raise _refuse("token expired")
    if exp - now > max_ttl_s + leeway_s:
        raise _refuse(f"token lifetime is over the maximum of {max_ttl_s:.0f} s")
    if iat is not None:
        if iat > now + leeway_s:
            raise _refuse("token issued in the future")
        if exp - iat > max_ttl_s:
            raise _refuse(f"token lifetime is over the maximum of {max_ttl_s:.0f} s")
    if nbf is not None and nbf > now + leeway_s:
        raise _refuse("token not valid yet")


# -- issue and verify -------------------------------------------------------------
def issue_token(secret: str, user: str, ttl_s: int = 86_400, *,
                max_ttl_s: int = DEFAULT_MAX_TTL_S, now: float | None = None,
                device: str | None = None, platform: str | None = None) -> str:
    """A token for ``user`` valid ``ttl_s`` seconds; ValueError (a message for
    people) for a bad user id, a lifetime over ``max_ttl_s`` or no secret."""
    if len(secret.encode()) < _MIN_SECRET or secret in PUBLIC_SECRETS:
        raise ValueError("no usable secret (IM_AUTH_SECRET, at least 32 bytes)")
    if why := check_user_id(user):
        raise ValueError(why)
    if not 0 < ttl_s <= max_ttl_s:
        raise ValueError(f"--ttl must be 1..{max_ttl_s} seconds (the maximum token "
                         "lifetime, IM_AUTH_MAX_TTL_S)")
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {"sub": user, "iat": issued, "exp": issued + ttl_s}
    if device is not None or platform is not None:
        device, platform = check_device(device, platform)
        claims.update({k: v for k, v in (("device", device), ("platform", platform)) if v})
    return jwt.encode(claims, secret, ALGORITHM)


@dataclass(frozen=True, slots=True)
class Token:
    """What a verified token says: the user, and until when it holds."""

    user: str
    exp: float
    iat: float | None
    # The login policy's device and platform when the product's backend put them
    # in the token (claims ``device`` / ``platform``): they win over the handshake's.
    device: str | None = None
    platform: str | None = None


@dataclass(frozen=True)
class TokenVerifier:
    """Checks tokens against the secret (HS256) and, given one, a public key
    (RS256 / ES256), then the lifetime rules and ``iss`` / ``aud``."""

    secret: str
    max_ttl_s: float = DEFAULT_MAX_TTL_S
    leeway_s: float = DEFAULT_LEEWAY_S
    public_key: str = ""  # PEM
    issuer: str = ""
    audience: str = ""

    @classmethod
    def from_settings(cls, settings: Settings) -> TokenVerifier:
        return cls(settings.auth_secret, settings.auth_max_ttl_s, settings.auth_leeway_s,
                   load_public_key(settings.auth_public_key_file), settings.auth_issuer,
                   settings.auth_audience)

    def verify(self, token: str | None, now: float | None = None) -> str:
        """Return the user id in a valid token; raise ``unauthorized`` otherwise."""
        return self.check(token, now).user

    def __post_init__(self) -> None:
        # The HS256 fast path's key, once (None: every token goes through PyJWT).
        object.__setattr__(self, "_mac", _hs256_mac(self.secret)
                           if not (self.issuer or self.audience) else None)

    def check(self, token: str | None, now: float | None = None) -> Token:
        """The verified token; raise ``unauthorized`` otherwise."""
        if not token:
            raise _refuse("a token is required")
        claims = self._fast_hs256(token)
        if claims is None:
            claims = self._decode(token)
        check_times(claims, time.time() if now is None else now, self.max_ttl_s,
                    self.leeway_s)
        sub = claims.get("sub")
        if check_user_id(sub) is not None:
            raise _refuse("token subject is not a valid user id")
        assert isinstance(sub, str)
        iat = _number(claims, "iat")
        device, platform = claims.get("device"), claims.get("platform")
        if device is not None or platform is not None:
            try:  # each as the handshake's would be checked (a non-string: malformed)
                check_device(device if isinstance(device, str) or device is None else "\x00",
                             platform if isinstance(platform, str) or platform is None
                             else "\x00")
            except DeviceError as err:
                raise _refuse(f"token claim: {err}") from None
        return Token(sub, float(claims["exp"]), iat, device, platform)

    def _fast_hs256(self, token: str) -> dict[str, Any] | None:
        """The claims of a plain HS256 token (header ``alg`` and ``typ`` only, no
        ``iss`` / ``aud`` configured), checked as PyJWT checks them at a fifth of
        its cost (a connect storm's handshakes); None: not such a token, PyJWT
        decides."""
        mac: hmac.HMAC | None = self.__dict__.get("_mac")
        if mac is None:
            return None
        try:
            raw = token.encode()
            signing_input, signature = raw.rsplit(b".", 1)
            head, body = signing_input.split(b".", 1)
            header = json.loads(base64url_decode(head))
        except (ValueError, RecursionError, UnicodeError, TypeError):
            return None
        if not (isinstance(header, dict) and header.get("alg") == ALGORITHM
                and header.keys() <= {"alg", "typ"}):
            return None
        check = mac.copy()
        check.update(signing_input)
        try:
            if not hmac.compare_digest(check.digest(), base64url_decode(signature)):
                raise _refuse("token is invalid")
            claims = json.loads(base64url_decode(body))
        except (ValueError, RecursionError, TypeError):
            raise _refuse("token is invalid") from None
        if not isinstance(claims, dict):
            raise _refuse("token is invalid")
        for name in _DECODE_OPTIONS["require"]:
            if claims.get(name) is None:
                raise _refuse(f"token claim {name} is required")
        if not isinstance(claims["sub"], str) or not isinstance(claims.get("jti", ""), str):
            raise _refuse("token is invalid")
        return claims

    def _decode(self, token: str) -> dict[str, Any]:
        try:
            alg = jwt.get_unverified_header(token).get("alg")
        except jwt.PyJWTError:
            raise _refuse("token is invalid") from None
        if alg == ALGORITHM:
            if len(self.secret.encode()) < _MIN_SECRET or self.secret in PUBLIC_SECRETS:
                raise _refuse("token is invalid")  # no usable secret: nothing verifies
            key, algorithms = self.secret, [ALGORITHM]
        elif alg in PUBLIC_ALGORITHMS and self.public_key:
            key, algorithms = self.public_key, list(PUBLIC_ALGORITHMS)
        else:
            raise _refuse("token is invalid")
        options: Any = {**_DECODE_OPTIONS, "verify_aud": bool(self.audience)}
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=algorithms, options=options,
                issuer=self.issuer or None, audience=self.audience or None)
        except jwt.InvalidIssuerError:
            raise _refuse("token issuer is not accepted") from None
        except jwt.InvalidAudienceError:
            raise _refuse("token audience is not accepted") from None
        except jwt.MissingRequiredClaimError as exc:
            what = {"iss": "issuer", "aud": "audience"}.get(exc.claim)
            raise _refuse(f"token {what} is not accepted" if what else
                          f"token claim {exc.claim} is required") from None
        except jwt.PyJWTError:
            raise _refuse("token is invalid") from None
        return claims


def _hs256_mac(secret: str) -> hmac.HMAC | None:
    """The secret's HMAC, ready to copy; None when PyJWT must decide (no usable
    secret, or one PyJWT refuses as an HMAC key)."""
    key = secret.encode()
    if len(key) < _MIN_SECRET or secret in PUBLIC_SECRETS:
        return None
    try:
        jwt.get_algorithm_by_name(ALGORITHM).prepare_key(key)
    except jwt.PyJWTError:
        return None
    return hmac.new(key, digestmod=hashlib.sha256)


def load_public_key(path: str) -> str:
    """The PEM in ``path`` ("" when no path is set); ``SecretError`` names a file
    that cannot be read or holds no RSA / EC public key."""
    if not path:
        return ""
    try:
        pem = Path(path).expanduser().read_text()
    except OSError as exc:
        raise SecretError(f"cannot read IM_AUTH_PUBLIC_KEY_FILE {path}: {exc.strerror}") \
            from None
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(pem.encode())
    except ValueError:
        raise SecretError(f"IM_AUTH_PUBLIC_KEY_FILE {path} holds no PEM public key") \
            from None
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise SecretError(f"IM_AUTH_PUBLIC_KEY_FILE {path}: an RSA or EC key is needed")
    return pem


def verify_token(secret: str, token: str | None, *, max_ttl_s: float = DEFAULT_MAX_TTL_S,
                 leeway_s: float = DEFAULT_LEEWAY_S, now: float | None = None) -> str:
    """``TokenVerifier(secret, max_ttl_s, leeway_s).verify(token, now)``."""
    return TokenVerifier(secret, max_ttl_s, leeway_s).verify(token, now)


def bearer_token(header: str | None) -> str | None:
    """The token in an ``Authorization: Bearer ...`` header, if any."""
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


# -- the secret -----------------------------------------------------------------
class SecretError(Exception):
    """The local secret file cannot be used; the message says why and where."""


def secret_path(settings: Settings, env: Mapping[str, str] | None = None) -> Path:
    """``IM_AUTH_SECRET_FILE``, else ``$XDG_STATE_HOME/imgate/auth_secret``
    (``~/.local/state/imgate/auth_secret``)."""
    if settings.auth_secret_file:
        return Path(settings.auth_secret_file).expanduser()
    env = os.environ if env is None else env
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "imgate" / "auth_secret"


def load_secret(path: Path) -> str:
    """The secret kept in ``path``, made on first use: 32 random bytes, in a file
    of mode 0600 owned by this user. Creation is atomic (written aside, then
    hard-linked into place, which fails if the name exists), so nodes starting
    together agree on one secret."""
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".auth_secret.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process made it first: use theirs
        finally:
            os.unlink(tmp)
    except OSError as exc:
        raise SecretError(f"cannot create the secret file {path}: {exc.strerror}") from None
    return _read_secret(path)


def _read_secret(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SecretError(f"cannot read the secret file {path}: {exc.strerror}") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise SecretError(f"the secret file {path} must be a regular file of this user")
        if st.st_mode & 0o077:
            raise SecretError(f"the secret file {path} is open to other users "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
        secret = f.read().strip()
    if len(secret.encode()) < _MIN_SECRET or secret in PUBLIC_SECRETS:
        raise SecretError(f"the secret file {path} holds no usable secret (32+ bytes); "
                          "delete it to make a new one")
    return secret


def with_secret(settings: Settings) -> tuple[Settings, Path | None]:
    """``settings`` with a usable ``auth_secret``: the configured one (and None),
    or the local file's (and its path, for the warning the caller logs)."""
    if settings.auth_secret:
        return settings, None
    path = secret_path(settings)
    return replace(settings, auth_secret=load_secret(path)), path
