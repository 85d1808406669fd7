"""``IM_AMQP_URL``: one AMQP URL, or a comma-separated list of a cluster's nodes.

Pure code (no I/O): ``parse_amqp_urls`` checks the setting and returns the
URLs in order; ``mask_password`` hides a URL's password for logs and
messages. A comma inside a password must be written ``%2C``. Connecting to
them in turn is ``router.amqp_link``'s.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["AmqpUrlError", "mask_password", "parse_amqp_urls"]

_SCHEMES = ("amqp", "amqps")


class AmqpUrlError(ValueError):
    """``IM_AMQP_URL`` cannot be used; the message names it and the bad item."""


def parse_amqp_urls(raw: str) -> list[str]:
    """The AMQP URLs in ``raw`` (comma-separated, blanks around items ignored).

    Each item must be an ``amqp://`` or ``amqps://`` URL with a host (and a
    valid port, if one is given); an empty item is refused, as is an empty
    setting. Duplicates are kept: the order is the failover order.
    """
    items = [item.strip() for item in raw.split(",")]
    if items == [""]:
        raise AmqpUrlError("IM_AMQP_URL is empty: give an amqp:// URL, or several "
                           "separated by commas (one per cluster node)")
    urls: list[str] = []
    for n, item in enumerate(items, 1):
        where = f"IM_AMQP_URL item {n} of {len(items)}"
        if not item:
            raise AmqpUrlError(f"{where} is empty (a stray comma?): give amqp:// URLs "
                               "separated by single commas")
        shown = mask_password(item)
        try:
            parts = urlsplit(item)
            port = parts.port
        except ValueError as exc:
            raise AmqpUrlError(f"{where} ({shown}) is not a URL: {exc}") from None
        if parts.scheme.lower() not in _SCHEMES:
            raise AmqpUrlError(f"{where} ({shown}) must start with amqp:// or amqps://")
        if not parts.hostname:
            raise AmqpUrlError(f"{where} ({shown}) names no host")
        if port == 0:
            raise AmqpUrlError(f"{where} ({shown}) has port 0")
        urls.append(item)
    return urls


def mask_password(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    head, sep, tail = url.rpartition("@")
    scheme, slashes, creds = head.partition("//")
    if not sep or not slashes or ":" not in creds:
        return url
    return f"{scheme}//{creds.split(':', 1)[0]}:***@{tail}"
