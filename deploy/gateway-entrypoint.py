"""The gateway image's entrypoint: Docker secrets into ``IM_*`` settings, then the node.

Compose mounts each secret as a file under ``/run/secrets`` (``IMGATE_SECRETS_DIR``
here). A setting names one as ``{secret:NAME}``, e.g.
``IM_REDIS_URL=redis://:{secret:redis_password}@redis:6379/0``: this replaces
it with the file's content (one trailing newline dropped), percent-encoded in
the ``IM_*_URL`` settings (a password inside a URL) and as it is elsewhere
(``IM_AUTH_SECRET``, ``IM_API_KEYS``). The values then exist only in the
environment of this process and of the node it becomes: not in the compose
file, the image, or ``docker inspect``.

    imgate-entrypoint [ARGS...]   # ARGS of `python -m gateway` (default: serve)

e.g. ``docker compose run --rm gateway token alice``. A missing or empty
secret file stops it with exit status 2 and a line naming the setting.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

PLACEHOLDER = re.compile(r"\{secret:([A-Za-z0-9][A-Za-z0-9_.-]*)\}")
SECRETS_DIR = "/run/secrets"


class SecretError(Exception):
    """A ``{secret:NAME}`` that cannot be filled in; the message names the setting."""


def read_secret(secrets_dir: Path, name: str, setting: str) -> str:
    path = secrets_dir / name
    try:
        value = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecretError(f"{setting}: cannot read secret {name!r} ({path}): "
                          f"{exc.strerror or exc}") from None
    if value.endswith("\r\n"):
        value = value[:-2]
    elif value.endswith("\n"):
        value = value[:-1]
    if not value:
        raise SecretError(f"{setting}: secret {name!r} ({path}) is empty")
    return value


def fill_secrets(env: Mapping[str, str], secrets_dir: Path) -> dict[str, str]:
    """The ``IM_*`` settings of ``env`` that name secrets, with the secrets in."""
    filled: dict[str, str] = {}
    for setting, raw in env.items():
        if not setting.startswith("IM_") or "{secret:" not in raw:
            continue
        if "{secret:" in PLACEHOLDER.sub("", raw):
            raise SecretError(f"{setting}: a {{secret:...}} that is not "
                              "{secret:NAME} (NAME: letters, digits, _ . -)")
        in_url = setting.endswith("_URL")

        def value(m: re.Match[str], setting: str = setting, in_url: bool = in_url) -> str:
            secret = read_secret(secrets_dir, m.group(1), setting)
            return quote(secret, safe="") if in_url else secret

        filled[setting] = PLACEHOLDER.sub(value, raw)
    return filled


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    try:
        env.update(fill_secrets(env, Path(env.get("IMGATE_SECRETS_DIR", SECRETS_DIR))))
    except SecretError as exc:
        print(f"imgate-entrypoint: {exc}", file=sys.stderr)
        return 2
    args = argv or ["serve"]
    os.execve(sys.executable, [sys.executable, "-m", "gateway", *args], env)
    return 0  # not reached: execve replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
