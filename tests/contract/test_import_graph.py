"""The shape of `app/` and `bench/`: no import cycles between the modules of either, nothing of
`tests/` imported by a benchmark, no oversized module in the core, and no module of `app/` growing
past the same limit.

Read from the source with `ast`, nothing is imported. Every import counts as an edge: at module
level, inside a function, under `if TYPE_CHECKING:` (a cycle that only type checkers see is still
a knot two modules can only be changed together). A lazy import is how a cycle is usually hidden,
not how it is removed.

Nodes are modules named as Python does (`app/core/planner.py` is `app.core.planner`, a package's
`__init__.py` is the package; `bench/replay_quality.py` is `bench.replay_quality`). Edges, said
for `app` (a graph of `bench` reads `bench.x` the same way):

- `import app.x.y` goes to `app.x.y`;
- `from app.x import y` goes to `app.x.y` when that is a module (the import loads it), else to
  `app.x` (`y` is a name defined there);
- relative imports are resolved against the importing module's package first.

A target that is not a file under `app/` (a typo, a module being moved) goes to its longest
prefix that is one, or nowhere. Importing `app.x.y` also runs `app/x/__init__.py`, but that
implicit edge is not drawn. One package re-exports its submodules' names (`app/config/__init__.py`,
so that callers import `from app.config`): its submodules import one another by their full module
paths, never the package, and a submodule that did (`from app.config import name`) would make a
real cycle through the `__init__`, which this test reporting is what we want.

`bench/` is a package whose scripts run as `python -m bench.NAME`. Its modules share helpers by
importing each other, so a cycle between them is the same knot as in `app/`. It imports nothing
from `tests/`: a benchmark's helpers are its own (`bench/service.py`), so a change to the test
suite's fixtures cannot change what a benchmark measures, and the suite is free to change them.

Module size: a module over 500 lines is one that does several things, and none in `app/` may be.
`OVERSIZED_TODAY` is where a module over the limit would be listed with its length, while it is
being split: it may not grow, and it leaves the list once under the limit. The list is empty.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
APP_DIR = REPO_ROOT / "app"
CORE_DIR = APP_DIR / "core"
MAX_MODULE_LINES = 500


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # `app/x.py:12`, the import statement


def module_name(path: Path, root: Path) -> str:
    """`app/core/planner.py` -> `app.core.planner`, `app/core/__init__.py` -> `app.core`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, modules: Iterable[str]) -> str | None:
    """`name` if it is a module, else its longest prefix that is one; None when none is."""
    known = set(modules)
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def _relative_base(module: str, is_package: bool, level: int) -> str | None:
    """The package a `from .{level}` import starts from; None when it climbs out of the tree."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(package) - 1:
        return None
    return ".".join(package[: len(package) - (level - 1)])


def imports_of(
    module: str,
    source: str,
    filename: str,
    modules: Iterable[str],
    *,
    is_package: bool = False,
    packages: tuple[str, ...] = ("app",),
) -> list[Edge]:
    """The edges from `module` (whose text is `source`) to other modules among `modules`; only
    imports of the top-level `packages` count."""
    known = set(modules)
    edges: list[Edge] = []

    def add(target: str | None, lineno: int) -> None:
        if target is None or not any(target == p or target.startswith(p + ".") for p in packages):
            return
        resolved = _resolve(target, known)
        # A module naming itself (`from app.pkg import name` inside app/pkg/__init__.py) is no cycle.
        if resolved is not None and resolved != module:
            edges.append(Edge(module, resolved, f"{filename}:{lineno}"))

    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _relative_base(module, is_package, node.level)
                if base is None:
                    continue
                parent = f"{base}.{node.module}" if node.module else base
            else:
                parent = node.module or ""
            for alias in node.names:
                submodule = f"{parent}.{alias.name}"
                add(submodule if submodule in known else parent, node.lineno)
    return edges


def package_graph(
    package: str, root: Path = REPO_ROOT, *, reaching: tuple[str, ...] = ()
) -> tuple[dict[str, set[str]], list[Edge]]:
    """Every module under `root/package` -> the modules of `package` it imports, and the edges
    with their lines: those, and the imports of the packages in `reaching` (their modules read
    from `root` too; a name that is none of them goes to the package itself)."""
    paths = sorted((root / package).rglob("*.py"))
    names = {module_name(p, root): p for p in paths}
    known = set(names) | set(reaching)
    for other in reaching:
        known.update(module_name(p, root) for p in (root / other).rglob("*.py"))
    graph: dict[str, set[str]] = {name: set() for name in names}
    edges: list[Edge] = []
    for name, path in names.items():
        found = imports_of(
            name,
            path.read_text(encoding="utf-8"),
            str(path.relative_to(root)),
            known,
            is_package=path.name == "__init__.py",
            packages=(package, *reaching),
        )
        edges.extend(found)
        graph[name].update(e.target for e in found if e.target in names)
    return graph, edges


def app_graph(root: Path = REPO_ROOT) -> tuple[dict[str, set[str]], list[Edge]]:
    """Every module under `root/app` -> the modules it imports, and the edges with their lines."""
    return package_graph("app", root)


def bench_graph(root: Path = REPO_ROOT) -> tuple[dict[str, set[str]], list[Edge]]:
    """Every module under `root/bench` -> the bench modules it imports; the edges include its
    imports of `tests`."""
    return package_graph("bench", root, reaching=("tests",))


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted, in
    sorted order. (Self-edges are never drawn, see `imports_of`.)"""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _shortest_path(graph: Mapping[str, Iterable[str]], start: str, goal: str, within: set[str]) -> list[str]:
    """Breadth-first, inside one component (where a path always exists)."""
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for nxt in sorted(graph.get(node, ())):
            if nxt in within and nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    path: list[str] = []
    at: str | None = goal
    while at is not None:
        path.append(at)
        at = previous[at]
    return path[::-1]


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """For every edge that lies on a cycle, the shortest cycle through it, as `[a, b, ..., a]`
    rotated to start at its smallest module; duplicates removed. Every import that has to go
    for the graph to become acyclic appears in at least one of them (listing all elementary
    cycles instead can blow up combinatorially in a large knot)."""
    found: set[tuple[str, ...]] = set()
    for component in strongly_connected(graph):
        members = set(component)
        for source in component:
            for target in sorted(set(graph.get(source, ())) & members):
                loop = [source, *_shortest_path(graph, target, source, members)][:-1]
                start = loop.index(min(loop))
                rotated = loop[start:] + loop[:start]
                found.add((*rotated, rotated[0]))
    return [list(c) for c in sorted(found)]


def describe_cycles(graph: Mapping[str, Iterable[str]], edges: Iterable[Edge]) -> str:
    """One `a -> b -> a` line per cycle, each import of it below with where it is."""
    where: dict[tuple[str, str], list[str]] = {}
    for edge in edges:
        spots = where.setdefault((edge.source, edge.target), [])
        if edge.where not in spots:
            spots.append(edge.where)
    lines: list[str] = []
    for loop in cycles(graph):
        lines.append(" -> ".join(loop))
        for source, target in zip(loop, loop[1:], strict=False):
            lines.append(f"    {source} -> {target}: {', '.join(where.get((source, target), ['?']))}")
    return "\n".join(lines)


def test_app_modules_are_found() -> None:
    # Guards the test itself: an empty or mis-rooted walk would find no cycle anywhere.
    graph, edges = app_graph()
    assert {"app", "app.main", "app.core", "app.store", "app.workers.loop"} <= set(graph)
    assert any(e.source == "app.main" for e in edges)


def test_no_import_cycles_in_app() -> None:
    graph, edges = app_graph()
    report = describe_cycles(graph, edges)
    if report:
        pytest.fail("import cycles between app modules:\n" + report, pytrace=False)


# app.plotting: what both HTML reports draw alike (it imports nothing of app).
REPORTS_MAY_IMPORT = ("app.reports", "app.core", "app.store", "app.plotting")


def test_reports_import_only_core_store_and_plotting() -> None:
    # app/reports/__init__.py: the room turns stored records into views; app.api and app.workers
    # call into it, never the other way round.
    _, edges = app_graph()
    wrong = [
        f"{e.where}: {e.source} imports {e.target}"
        for e in edges
        if (e.source == "app.reports" or e.source.startswith("app.reports."))
        and not any(e.target == p or e.target.startswith(p + ".") for p in REPORTS_MAY_IMPORT)
    ]
    allowed = ", ".join(REPORTS_MAY_IMPORT[1:])
    assert wrong == [], f"app/reports may import only {allowed}:\n" + "\n".join(wrong)


def test_bench_modules_are_found() -> None:
    graph, edges = bench_graph()
    assert {"bench", "bench.replay_quality", "bench.miss_causes", "bench.matrix_report"} <= set(graph)
    assert any(e.source == "bench.replay_quality" and e.target == "bench.miss_causes" for e in edges)


def test_no_import_cycles_in_bench() -> None:
    graph, edges = bench_graph()
    report = describe_cycles(graph, edges)
    if report:
        pytest.fail("import cycles between bench modules:\n" + report, pytrace=False)


def test_bench_imports_nothing_from_tests() -> None:
    _, edges = bench_graph()
    wrong = sorted(
        {
            f"{e.where}: {e.source} imports {e.target}"
            for e in edges
            if e.target == "tests" or e.target.startswith("tests.")
        }
    )
    assert wrong == [], "bench may not import from tests (bench/service.py has its own helpers):\n" + (
        "\n".join(wrong)
    )


def line_counts(directory: Path) -> dict[str, int]:
    return {
        str(p.relative_to(REPO_ROOT)): len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(directory.rglob("*.py"))
    }


def core_line_counts() -> dict[str, int]:
    return line_counts(CORE_DIR)


def test_core_modules_are_small() -> None:
    counts = core_line_counts()
    assert counts, "no module found under app/core"
    offenders = sorted(((n, path) for path, n in counts.items() if n > MAX_MODULE_LINES), reverse=True)
    if offenders:
        pytest.fail(
            f"modules under app/core longer than {MAX_MODULE_LINES} lines:\n"
            + "\n".join(f"{path}: {n} lines" for n, path in offenders),
            pytrace=False,
        )


# The modules of app/ that were over MAX_MODULE_LINES when the limit came to all of app/, with
# their length then (lines). None may grow; one that comes under the limit, or is gone (moved,
# split), leaves the list.
OVERSIZED_TODAY: dict[str, int] = {}


def oversized_problems(counts: Mapping[str, int], oversized: Mapping[str, int]) -> list[str]:
    """What breaks the limit in `counts` (path -> lines) given the `oversized` list: a module over
    the limit that is not listed, a listed one longer than its recorded length, a listed one that
    is no longer over the limit or no longer there. Sorted by path."""
    problems = [
        f"{path}: gone: remove it from OVERSIZED_TODAY" for path in sorted(oversized) if path not in counts
    ]
    for path, n in sorted(counts.items()):
        recorded = oversized.get(path)
        if recorded is None:
            if n > MAX_MODULE_LINES:
                problems.append(f"{path}: {n} lines, over {MAX_MODULE_LINES}")
        elif n > recorded:
            problems.append(f"{path}: {n} lines, grew from {recorded} (OVERSIZED_TODAY)")
        elif n <= MAX_MODULE_LINES:
            problems.append(f"{path}: {n} lines, under the limit now: remove it from OVERSIZED_TODAY")
    return sorted(problems)


def test_app_modules_are_small_or_listed_and_not_growing() -> None:
    counts = line_counts(APP_DIR)
    assert counts, "no module found under app"
    assert not any(path.startswith("app/core/") for path in OVERSIZED_TODAY), "app/core has no exceptions"
    problems = oversized_problems(counts, OVERSIZED_TODAY)
    if problems:
        pytest.fail(
            f"modules of app longer than {MAX_MODULE_LINES} lines, or OVERSIZED_TODAY out of date:\n"
            + "\n".join(problems),
            pytrace=False,
        )


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"app/a.py": 500, "app/big.py": 700}, []),
        ({"app/a.py": 501, "app/big.py": 700}, ["app/a.py: 501 lines, over 500"]),
        ({"app/big.py": 701}, ["app/big.py: 701 lines, grew from 700 (OVERSIZED_TODAY)"]),
        ({"app/big.py": 650}, []),
        ({"app/big.py": 500}, ["app/big.py: 500 lines, under the limit now: remove it from OVERSIZED_TODAY"]),
        ({}, ["app/big.py: gone: remove it from OVERSIZED_TODAY"]),
    ],
    ids=["within", "new_oversized", "listed_grew", "listed_shrank", "listed_now_small", "listed_gone"],
)
def test_oversized_problems(counts: dict[str, int], expected: list[str]) -> None:
    assert oversized_problems(counts, {"app/big.py": 700}) == expected


# --- the checker on small cases -----------------------------------------------------------------

MODULES = {
    "app",
    "app.a",
    "app.b",
    "app.pkg",
    "app.pkg.mod",
    "app.pkg.sub",
    "app.pkg.sub.deep",
    "bench",
    "bench.a",
    "bench.b",
    "tests",
    "tests.support",
}


@dataclass(frozen=True)
class ImportCase:
    name: str
    why: str
    module: str
    source: str
    expected: list[str]
    is_package: bool = False
    packages: tuple[str, ...] = ("app",)


IMPORT_CASES = [
    ImportCase("absolute", "import app.x", "app.a", "import app.b\n", ["app.b"]),
    ImportCase("aliased", "an alias changes nothing", "app.a", "import app.pkg.mod as m\n", ["app.pkg.mod"]),
    ImportCase("from_module", "names from a module", "app.a", "from app.b import f, g\n", ["app.b", "app.b"]),
    ImportCase(
        "from_package_submodule",
        "`from app.pkg import mod` loads the submodule",
        "app.a",
        "from app.pkg import mod\n",
        ["app.pkg.mod"],
    ),
    ImportCase(
        "from_package_name",
        "`from app.pkg import name` is the package itself",
        "app.a",
        "from app.pkg import thing\n",
        ["app.pkg"],
    ),
    ImportCase(
        "missing_module",
        "a module that is not there goes to its nearest existing parent",
        "app.a",
        "from app.pkg.gone import x\n",
        ["app.pkg"],
    ),
    ImportCase("outside_app", "other packages are no edges", "app.a", "import os\nfrom numpy import e\n", []),
    ImportCase(
        "in_function",
        "a lazy import counts",
        "app.a",
        "def f():\n    from app.b import g\n    return g\n",
        ["app.b"],
    ),
    ImportCase(
        "type_checking",
        "so does one only type checkers see",
        "app.a",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.b import B\n",
        ["app.b"],
    ),
    ImportCase("relative_sibling", "from . import", "app.pkg.mod", "from . import sub\n", ["app.pkg.sub"]),
    ImportCase(
        "relative_name",
        "from .x import name",
        "app.pkg.sub.deep",
        "from ..mod import f\n",
        ["app.pkg.mod"],
    ),
    ImportCase(
        "relative_in_package",
        "from . in an __init__ is the package itself",
        "app.pkg",
        "from .sub import deep\n",
        ["app.pkg.sub.deep"],
        is_package=True,
    ),
    ImportCase("self", "naming itself is no edge", "app.pkg", "from app.pkg import thing\n", [], True),
    ImportCase(
        "bench_and_tests",
        "with `packages` given, their imports count and app's do not",
        "bench.a",
        "from bench.b import f\nfrom tests.support import g\nimport app.b\n",
        ["bench.b", "tests.support"],
        packages=("bench", "tests"),
    ),
    ImportCase(
        "bench_relative",
        "a relative import inside bench",
        "bench.a",
        "from . import b\n",
        ["bench.b"],
        packages=("bench",),
    ),
]


@pytest.mark.parametrize("case", IMPORT_CASES, ids=lambda c: c.name)
def test_import_edges(case: ImportCase) -> None:
    found = imports_of(
        case.module, case.source, "m.py", MODULES, is_package=case.is_package, packages=case.packages
    )
    assert [e.target for e in found] == case.expected, case.why


@dataclass(frozen=True)
class CycleCase:
    name: str
    graph: dict[str, set[str]]
    expected: list[list[str]]


CYCLE_CASES = [
    CycleCase("acyclic", {"a": {"b", "c"}, "b": {"c"}, "c": set()}, []),
    CycleCase("two", {"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b", "a"]]),
    CycleCase("three", {"c": {"a"}, "a": {"b"}, "b": {"c"}}, [["a", "b", "c", "a"]]),
    CycleCase(
        "two_loops_in_one_knot",
        {"a": {"b", "c"}, "b": {"a"}, "c": {"a"}},
        [["a", "b", "a"], ["a", "c", "a"]],
    ),
    CycleCase(
        "separate_knots",
        {"a": {"b"}, "b": {"a"}, "x": {"y"}, "y": {"x", "a"}},
        [["a", "b", "a"], ["x", "y", "x"]],
    ),
]


@pytest.mark.parametrize("case", CYCLE_CASES, ids=lambda c: c.name)
def test_cycles(case: CycleCase) -> None:
    assert cycles(case.graph) == case.expected


def test_describe_cycles_names_the_imports() -> None:
    graph = {"app.a": {"app.b"}, "app.b": {"app.a"}}
    edges = [Edge("app.a", "app.b", "app/a.py:3"), Edge("app.b", "app.a", "app/b.py:9")]
    assert describe_cycles(graph, edges) == (
        "app.a -> app.b -> app.a\n    app.a -> app.b: app/a.py:3\n    app.b -> app.a: app/b.py:9"
    )
