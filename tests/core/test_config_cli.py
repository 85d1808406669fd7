"""The settings as a person meets them (gateway/config_cli.py): every setting
documented from its one definition, an env file, a check that names every
problem, secrets masked; README's table and the example env file equal to
what the definition prints; and the commands themselves."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from gateway.cli import settings as config_cli
from gateway.config import ConfigError, Settings, parse_workers

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_has_a_meaning():
    assert [f.name for f in fields(Settings) if not f.metadata.get("help")] == []


def test_readme_table_and_example_env_file_are_printed_from_the_definition():
    readme = (ROOT / "README.md").read_text()
    start = "<!-- settings table: python -m gateway config --markdown -->\n"
    table = readme[readme.index(start) + len(start):readme.index("<!-- end of settings table")]
    assert table == config_cli.markdown_table() + "\n", \
        "README's table is stale: regenerate it with python -m gateway config --markdown"
    assert (ROOT / "deploy/imgate.env.example").read_text() == config_cli.example_env() + "\n", \
        "regenerate deploy/imgate.env.example with python -m gateway config --example"


def test_the_example_env_file_reads_back_as_the_defaults(tmp_path):
    path = tmp_path / "imgate.env"
    path.write_text("\n".join(line[2:] if re.fullmatch(r"# IM_[A-Z0-9_]+=.*", line) else line
                              for line in config_cli.example_env().splitlines()))
    env = config_cli.read_env_file(path)
    assert len(env) == len(fields(Settings))
    checked = config_cli.check({}, env)
    assert checked.problems == [] and checked.settings == Settings()


def test_an_env_file_takes_quotes_export_and_comments_and_names_a_bad_line(tmp_path):
    path = tmp_path / "a.env"
    path.write_text("# comment\n\nexport IM_NAMESPACE=one\nIM_WS_PORT = '9000'\n"
                    'IM_CORS_ORIGINS="https://a.example"\n')
    assert config_cli.read_env_file(path) == {
        "IM_NAMESPACE": "one", "IM_WS_PORT": "9000", "IM_CORS_ORIGINS": "https://a.example"}
    path.write_text("IM_NAMESPACE=one\nthis is not a setting\n")
    with pytest.raises(ConfigError, match="line 2: expected NAME=value"):
        config_cli.read_env_file(path)
    with pytest.raises(ConfigError, match="env file"):
        config_cli.read_env_file(tmp_path / "missing.env")


def test_the_environment_wins_over_the_file_and_sources_are_told():
    checked = config_cli.check({"IM_WS_PORT": "9001"},
                               {"IM_WS_PORT": "9000", "IM_HTTP_PORT": "9002"})
    assert checked.settings is not None
    assert (checked.settings.ws_port, checked.settings.http_port) == (9001, 9002)
    lines = list(config_cli.render(checked.settings, checked.sources))
    assert "IM_WS_PORT=9001  # environment" in lines
    assert "IM_HTTP_PORT=9002  # env file" in lines
    assert "IM_HOST=127.0.0.1  # default" in lines


def test_a_check_names_every_problem_not_only_the_first():
    checked = config_cli.check({"IM_SEND_RATE": "fast", "IM_NODE_ID": "300",
                                "IM_SEND_RAET": "5", "IM_PRIVACY_DM": "friends"})
    assert checked.settings is None
    assert checked.problems == [
        "IM_SEND_RAET is not a setting (python -m gateway serve --help lists them)",
        "IM_SEND_RATE='fast' is not a float",
        "IM_NODE_ID must be in 0..255 (or unset to lease one)",
        "IM_PRIVACY_DM must be one of everyone, contacts"]
    # The relay's secret is an IM_ variable too, not a typo.
    assert config_cli.check({"IM_WEBHOOK_SECRET": "x" * 32}).problems == []


def test_secrets_and_url_passwords_are_masked():
    checked = config_cli.check({
        "IM_AUTH_SECRET": "s" * 40, "IM_API_KEYS": "k" * 30,
        "IM_AMQP_URL": "amqp://app:hunter2@mq1:5672/,amqp://app:hunter2@mq2:5672/",
        "IM_MONGO_URL": "mongodb://root:pw@db:27017/?authSource=admin"})
    assert checked.settings is not None
    text = "\n".join(config_cli.render(checked.settings, checked.sources))
    assert "hunter2" not in text and "s" * 40 not in text and "k" * 30 not in text
    assert "pw@" not in text
    assert "IM_AMQP_URL=amqp://app:***@mq1:5672/,amqp://app:***@mq2:5672/" in text
    assert "IM_AUTH_SECRET=<set, 40 characters>" in text


def _gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_serve_help_lists_every_setting_with_its_default():
    out = _gateway("serve", "--help")
    assert out.returncode == 0
    for f in fields(Settings):
        assert f"IM_{f.name.upper()} (" in out.stdout
    assert "IM_SEND_RATE (default: 20.0)" in out.stdout
    assert "--env-file FILE" in out.stdout


def test_config_prints_and_checks(tmp_path):
    good = tmp_path / "good.env"
    good.write_text("IM_NAMESPACE=fromfile\nIM_AUTH_SECRET=" + "z" * 32 + "\n")
    out = _gateway("config", "--env-file", str(good), env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "IM_NAMESPACE=fromfile  # env file" in out.stdout
    assert "z" * 32 not in out.stdout
    bad = _gateway("config", env={"IM_MAX_BODY": "0", "IM_FOO": "1", "PATH": "/usr/bin:/bin"})
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "gateway: IM_FOO is not a setting (python -m gateway serve --help lists them)",
        "gateway: IM_MAX_BODY must be positive"]
    example = _gateway("config", "--example")
    assert example.returncode == 0 and "# IM_SEND_RATE=20.0" in example.stdout


def test_workers_are_a_positive_number_or_auto() -> None:
    assert parse_workers("3") == 3
    assert parse_workers("auto") == len(os.sched_getaffinity(0))
    for bad in ("0", "-2", "many", ""):
        assert any("IM_WORKERS" in p for p in Settings(workers=bad).problems())
    assert any("IM_NODE_ID cannot be set" in p
               for p in Settings(workers="2", node_id=3).problems())
    assert not list(Settings(workers="auto").problems())
