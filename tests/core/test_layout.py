"""The package layering, read from the source with ``ast`` (nothing is imported).

Every import counts: at module level, inside functions, and under ``if
TYPE_CHECKING:`` (a cycle there is still a cycle in the design, and mypy
follows it). Rules (docs/architecture.md, "Packages and wings"): no import
cycle; only ``gateway/__main__.py`` imports the composition root
``gateway.node``; ``gateway`` never imports a driver; ``core`` imports no
other package of the project; ``store`` and ``router`` never import
``gateway`` or ``relay``; inside ``gateway``, the WebSocket wing (``ws``)
and the HTTP wing (``http``) never import each other and the feature wings
(``chat``, ``groups``, ``inbox``, ``rooms``, ``presence``, ``feed``) import
neither;
the root of ``gateway`` stays small; every module is under 600 lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "gateway", "relay", "router", "store")
DRIVERS = ("pymongo", "redis", "aio_pika", "aiormq")
MAX_LINES = 600
GATEWAY_ROOT_MAX = 16  # modules directly in gateway/ (the rest live in wings)
FEATURES = ("gateway.chat", "gateway.groups", "gateway.inbox", "gateway.rooms",
            "gateway.presence", "gateway.feed")
# (what is wrong, importing modules under these, may not import anything under these)
RULES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("gateway reaches a driver (go through store/ or router/):", ("gateway",), DRIVERS),
    ("core must stay pure:", ("core",), ("gateway", "relay", "router", "store")),
    ("store/ and router/ must not depend on gateway/ or relay/:", ("store", "router"),
     ("gateway", "relay")),
    ("the WebSocket wing must not import the HTTP wing (share through gateway.delivery):",
     ("gateway.ws",), ("gateway.http",)),
    ("the HTTP wing must not import the WebSocket wing (share through gateway.delivery):",
     ("gateway.http",), ("gateway.ws",)),
    ("a feature wing must not import the WebSocket or HTTP wing:", FEATURES,
     ("gateway.ws", "gateway.http")),
    ("the relay is a program of its own: it must not import gateway/:", ("relay",),
     ("gateway",)),
]


@dataclass(frozen=True)
class Edge:
    """``src`` imports ``dst`` at ``path:line``."""

    src: str
    dst: str
    path: str
    line: int
    type_checking: bool

    def __str__(self) -> str:
        guard = ", under TYPE_CHECKING" if self.type_checking else ""
        return f"{self.src} imports {self.dst} ({self.path}:{self.line}{guard})"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(
    tree: ast.AST, guarded: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every Import/ImportFrom under ``tree``, and whether TYPE_CHECKING guards it."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, guarded
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _imports(ast.Module([stmt], []), True)
            for stmt in child.orelse:
                yield from _imports(ast.Module([stmt], []), guarded)
        else:
            yield from _imports(child, guarded)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """Absolute names an import statement reaches (a submodule when one exists)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = _absolute(module, path.name == "__init__.py", node)
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield sub if sub in modules() else base


@cache
def imports() -> list[Edge]:
    """Every import of every module, to project modules and to third parties."""
    edges = []
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        rel = str(path.relative_to(ROOT))
        for node, guarded in _imports(tree):
            for target in dict.fromkeys(_targets(module, path, node)):
                edges.append(Edge(module, target, rel, node.lineno, guarded))
    return edges


def project_graph() -> dict[str, list[Edge]]:
    """Module -> its imports of project modules.

    An import of a project module that does not exist (yet) is left out: it
    would fail at import time anyway, and counting it as an import of its
    package would invent a cycle.
    """
    known = modules()
    graph: dict[str, list[Edge]] = {m: [] for m in known}
    for e in imports():
        if e.dst in known and e.dst != e.src:
            graph[e.src].append(e)
    return graph


@dataclass(frozen=True)
class Tangle:
    """Modules that import each other in a circle (a strongly connected component)."""

    members: list[str]
    example: list[Edge]  # one cycle through them
    edges: list[Edge]  # every import between two members: the ones to cut

    def __str__(self) -> str:
        path = " -> ".join([self.example[0].src, *(e.dst for e in self.example)])
        return (f"cycle among {', '.join(self.members)}\n  e.g. {path}\n"
                + "\n".join(f"    {e}" for e in self.edges))


def cycles(graph: dict[str, list[Edge]]) -> list[Tangle]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[Tangle] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in graph[v]:
            if e.dst not in index:
                visit(e.dst)
                low[v] = min(low[v], low[e.dst])
            elif e.dst in on_stack:
                low[v] = min(low[v], index[e.dst])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                inside = [e for m in sorted(component) for e in graph[m] if e.dst in component]
                found.append(Tangle(sorted(component), _cycle_in(graph, component, v), inside))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_in(graph: dict[str, list[Edge]], component: set[str], start: str) -> list[Edge]:
    """A shortest cycle from ``start`` back to itself inside ``component`` (BFS)."""
    parent: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for e in graph[v]:
                if e.dst == start:
                    path = [e]
                    while path[0].src != start:
                        path.insert(0, parent[path[0].src])
                    return path
                if e.dst in component and e.dst not in parent:
                    parent[e.dst] = e
                    nxt.append(e.dst)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")


def _violations(edges: list[Edge], sources: tuple[str, ...], banned: tuple[str, ...]
                ) -> list[str]:
    """Imports from modules under ``sources`` of anything under ``banned``."""
    def under(name: str, roots: tuple[str, ...]) -> bool:
        return any(name == r or name.startswith(r + ".") for r in roots)

    return [str(e) for e in edges if under(e.src, sources) and under(e.dst, banned)]


def broken_rules(edges: list[Edge]) -> list[str]:
    """Every rule of ``RULES`` the imports ``edges`` break, with the imports."""
    out = []
    for title, sources, banned in RULES:
        if bad := _violations(edges, sources, banned):
            out += [title, *(f"  {line}" for line in bad)]
    return out


def _fail(title: str, lines: list[str]) -> None:
    pytest.fail("\n".join([title, *lines]), pytrace=False)


# -- the rules --------------------------------------------------------------------------


def test_the_reader_finds_the_packages():
    found = modules()
    assert {"core", "core.ids", "gateway.node", "gateway.protocol"} <= set(found)
    assert any(e.src == "gateway.protocol" and e.dst == "core.ids" for e in imports())


def test_no_import_cycle():
    found = cycles(project_graph())
    if found:
        _fail(f"{len(found)} import cycle(s):", [str(t) for t in found])


def test_only_the_entry_point_imports_the_composition_root():
    bad = [str(e) for e in imports() if e.src != "gateway.__main__"
           and (e.dst == "gateway.node" or e.dst.startswith("gateway.node."))]
    if bad:
        _fail("only gateway/__main__.py may import gateway.node:", bad)


def test_no_import_breaks_a_layering_rule():
    if bad := broken_rules(imports()):
        _fail("imports against the layering:", bad)


@pytest.mark.parametrize(("src", "dst"), [
    ("gateway.ws.session", "gateway.http.server"),
    ("gateway.http.api", "gateway.ws.registry"),
    ("gateway.rooms.service", "gateway.ws.core"),
    ("gateway.inbox.ops", "gateway.http.models"),
    ("router.router", "gateway.hub"),
    ("store.keys", "relay.webhook"),
    ("core.ids", "router.envelope"),
    ("gateway.wire", "redis"),
    ("relay.webhook", "gateway.config"),
])
def test_a_planted_violation_is_caught(src: str, dst: str):
    planted = Edge(src, dst, src.replace(".", "/") + ".py", 1, False)
    assert broken_rules([planted]) != []
    assert broken_rules([*imports(), planted]) != broken_rules(imports())


def test_the_root_of_gateway_stays_small():
    root = sorted(p.name for p in (ROOT / "gateway").glob("*.py"))
    if len(root) > GATEWAY_ROOT_MAX:
        _fail(f"{len(root)} modules directly in gateway/ (at most {GATEWAY_ROOT_MAX}: put the "
              "new one in a wing):", root)


def test_modules_are_under_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in modules().values()
            if (n := len(p.read_text().splitlines())) >= MAX_LINES}
    if long:
        _fail(f"modules of {MAX_LINES}+ lines (split by concept):",
              [f"{path}: {n} lines" for path, n in long.items()])


# -- the reader itself, on small trees -------------------------------------------------------


def test_type_checking_and_nested_imports_are_seen():
    tree = ast.parse(
        "import a\n"
        "if TYPE_CHECKING:\n    from b import c\nelse:\n    import d\n"
        "if typing.TYPE_CHECKING:\n    import e\n"
        "def f():\n    import g\n")
    got = {(n.names[0].name if isinstance(n, ast.Import) else n.module): g
           for n, g in _imports(tree)}
    assert got == {"a": False, "b": True, "d": False, "e": True, "g": False}


def test_relative_imports_resolve():
    node = ast.parse("from ..router import base").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _absolute("gateway.wire", False, node) == "router"
    assert _absolute("gateway.chat.service", False, node) == "gateway.router"
    node = ast.parse("from . import protocol").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _absolute("gateway.wire", False, node) == "gateway"
    assert _absolute("gateway.chat.service", False, node) == "gateway.chat"
    assert _absolute("gateway", True, node) == "gateway"


def test_cycles_are_reported_with_their_path():
    def edge(a: str, b: str) -> Edge:
        return Edge(a, b, f"{a}.py", 1, False)

    graph = {"a": [edge("a", "b")], "b": [edge("b", "c")], "c": [edge("c", "a")],
             "d": [edge("d", "a")]}
    [tangle] = cycles(graph)
    assert tangle.members == ["a", "b", "c"]
    assert str(tangle).splitlines()[1] == "  e.g. a -> b -> c -> a"
    assert [(e.src, e.dst) for e in tangle.edges] == [("a", "b"), ("b", "c"), ("c", "a")]
    assert cycles({"a": [edge("a", "b")], "b": []}) == []
