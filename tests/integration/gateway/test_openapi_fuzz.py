"""A bounded schemathesis pass over ``/openapi.json`` against a real node: no 5xx,
every answer's status, content type, headers and body as documented, 405s
with a true ``Allow``, data the schema forbids refused, calls without the
token refused. Authenticated with a valid bearer token; a fixed seed,
no shrinking, a bounded number of examples per operation."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.conftest import token, uid

CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance",
    "response_headers_conformance", "response_schema_conformance", "unsupported_method",
    "allow_header_conformance", "negative_data_rejection", "missing_required_header",
    "ignored_auth",
])  # not positive_data_acceptance: rules no schema states (a post is a repost or a
    # comment, not both; a group's members only) answer schema-valid data with 4xx
MAX_EXAMPLES = 20  # per operation and phase
SEED = 20261123
BOUND_S = 300  # the whole pass; it takes about a minute
# One worker: with two, schemathesis builds hypothesis strategies in threads, and
# CPython 3.11's ast.parse (hypothesis describes lambdas with it) can raise a
# spurious "SystemError: AST constructor recursion depth mismatch" when two
# threads parse at once (CPython gh-106905); CI met it once under load. With
# one worker it was still met once, after the pass had reported 1,749 cases
# passed (schemathesis reports from a thread of its own): a run that fails
# with exactly that interpreter error is run once more, with the same seed;
# any other failure, or that error twice, fails the test.
CPYTHON_AST_BUG = "SystemError: AST constructor recursion depth mismatch"


@pytest.mark.edge_only
async def test_schemathesis_finds_nothing(make_node, tmp_path):
    node = await make_node(http_rate=0)  # the fuzzer is one user calling as fast as it can
    cmd = [sys.executable, "-m", "schemathesis.cli", "run",
           f"http://127.0.0.1:{node.http_port}/openapi.json",
           "-H", f"Authorization: Bearer {token(uid('st'))}",
           "--checks", CHECKS, "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
           "--no-shrink", "--workers", "1", "--request-timeout", "10",
           "--suppress-health-check", "all", "--generation-database", "none", "--no-color"]
    rc, text = await _run(cmd, tmp_path)
    if rc != 0 and CPYTHON_AST_BUG in text:
        # The interpreter's bug, not a finding (see above): the same seeded pass again.
        rc, text = await _run(cmd, tmp_path)
    assert rc == 0, text[-8000:]
    assert "no issues found" in text or " passed" in text, text[-2000:]


async def _run(cmd: list[str], cwd: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), BOUND_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")
