"""The settings as a person meets them: ``python -m gateway serve --help`` lists
each with its default and meaning, ``python -m gateway config`` prints the
effective configuration (secrets masked) and checks it, an env file supplies
``IM_*`` values, and README's table and ``deploy/imgate.env.example`` are
printed from the same definition (``gateway.config.Settings``). Pure."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import Field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gateway.config import ConfigError, Settings, convert

__all__ = ["Checked", "check", "env_name", "example_env", "markdown_table", "read_env_file",
           "render", "settings_help", "unknown_names"]

# IM_* variables that are not node settings: the webhook relay's secret.
OTHER_NAMES = frozenset({"IM_WEBHOOK_SECRET"})
SECRETS = frozenset({"auth_secret", "api_keys"})
URLS = frozenset({"redis_url", "amqp_url", "mongo_url"})
_LINE = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)")


def env_name(f: Field[Any]) -> str:
    return "IM_" + f.name.upper()


def _help(f: Field[Any]) -> str:
    return str(f.metadata.get("help", ""))


def _default(f: Field[Any]) -> str:
    value = f.default
    return "" if value == "" else str(value)


def settings_help(width: int = 79) -> str:
    """Every setting, its default and meaning: the epilog of ``serve --help``."""
    out = ["settings (environment variables, or lines NAME=value of --env-file; the "
           "environment wins):", ""]
    for f in fields(Settings):
        default = _default(f)
        out.append(f"  {env_name(f)}" + (f" (default: {default})" if default else " (unset)"))
        out += textwrap.wrap(_help(f), width, initial_indent="      ",
                             subsequent_indent="      ")
    return "\n".join(out)


def example_env() -> str:
    """An env file with every setting commented out at its default."""
    out = ["# imgate node settings: uncomment and change what you need.",
           "# Generated from gateway/config.py by `python -m gateway config --example`;",
           "# `python -m gateway serve --env-file FILE` reads it (the environment wins).", ""]
    for f in fields(Settings):
        out += textwrap.wrap(_help(f), 77, initial_indent="# ", subsequent_indent="# ")
        out += [f"# {env_name(f)}={_default(f)}", ""]
    return "\n".join(out)


def markdown_table() -> str:
    """README's configuration table."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for f in fields(Settings):
        default = _default(f)
        shown = f"`{default}`" if default else "unset"
        rows.append(f"| `{env_name(f)}` | {shown} | {_help(f).replace('|', '/')} |")
    return "\n".join(rows)


def read_env_file(path: str | Path) -> dict[str, str]:
    """``NAME=value`` lines (``export`` allowed, ``#`` comments, one pair of quotes
    around a value taken off); ConfigError naming the line of anything else."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"env file {path}: {exc.strerror or exc}") from None
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            raise ConfigError(f"env file {path}, line {n}: expected NAME=value")
        value = m.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[m.group(1)] = value
    return out


def unknown_names(env: Mapping[str, str]) -> list[str]:
    """``IM_*`` names that are no setting (a typo is otherwise silently ignored)."""
    known = {env_name(f) for f in fields(Settings)} | OTHER_NAMES
    return sorted(k for k in env if k.startswith("IM_") and k not in known)


class Checked:
    """What ``check`` found: the settings (None if any value could not be
    used) and one line per problem."""

    def __init__(self, settings: Settings | None, problems: list[str],
                 sources: dict[str, str]) -> None:
        self.settings, self.problems, self.sources = settings, problems, sources


def check(env: Mapping[str, str], file_env: Mapping[str, str] | None = None) -> Checked:
    """Every problem of the settings ``file_env`` then ``env`` give (``env``
    wins), not only the first: values that are not of their type, values a
    node refuses, and ``IM_*`` names that are no setting."""
    merged = {**(file_env or {}), **env}
    problems = [f"{name} is not a setting (python -m gateway serve --help lists them)"
                for name in unknown_names(merged)]
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for f in fields(Settings):
        raw = merged.get(env_name(f))
        if raw is None or raw == "":
            continue
        sources[f.name] = "environment" if env_name(f) in env else "env file"
        try:
            values[f.name] = convert(f.name, raw, type(f.default))
        except ConfigError as exc:
            problems.append(str(exc))
    settings = Settings(**values)  # type: ignore[arg-type]
    problems += list(settings.problems())
    return Checked(None if problems else settings, problems, sources)


def _masked(name: str, value: object) -> str:
    text = str(value)
    if name in SECRETS:
        return f"<set, {len(text)} characters>" if text else ""
    if name in URLS:
        return ",".join(_mask_url(u) for u in text.split(","))
    return text


def _mask_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.password is None:
        return url.strip()
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def render(settings: Settings, sources: Mapping[str, str]) -> Iterator[str]:
    """``IM_NAME=value  # where it came from`` per setting, secrets masked."""
    for f in fields(Settings):
        value = _masked(f.name, getattr(settings, f.name))
        yield f"{env_name(f)}={value}  # {sources.get(f.name, 'default')}"
