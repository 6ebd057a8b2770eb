"""Layer 0 (no process group): the modules of ``nemo_dist`` import one another in layers, never in a cycle.

Two properties: no import cycle anywhere in ``nemo_dist``, and every import
goes down the layers named here and in ``docs/ARCHITECTURE.md``
(:data:`PACKAGE_LAYERS`: the harness below the conformance package below the
console script, the components apart; :data:`CONFORMANCE_LAYERS`: the
conformance package's folders, engine to front ends, read from the tree). Imports within a layer are
free, as long as they make no cycle.

The graph is read from the source, not from ``sys.modules``: every module of
the package (found by :func:`pkgutil.iter_modules`, nothing imported) is
parsed with :mod:`ast`, and every ``import`` / ``from ... import`` naming a
``nemo_dist`` module is an edge, wherever it stands: at the top, inside a
function (a lazy import is still an import at run time), under ``try``. How
an import becomes an edge:

- ``import a.b.c`` is an edge to ``a.b.c``;
- ``from a.b import name`` is an edge to ``a.b.name`` when that is a module,
  else to ``a.b`` (the name is defined in ``a.b``, a package's
  ``__init__`` when ``a.b`` is a package); relative imports are resolved
  against the importing module's package first;
- a package's ``__init__`` is a node of its own (named as the package).
  Importing ``a.b.c`` also runs ``a.b``'s ``__init__``, but that implied
  edge is NOT counted: a package ``__init__`` that imports its submodules,
  and a submodule that imports a sibling through its package path, is the
  normal shape of a package, not a cycle;
- imports under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) do NOT
  count: they never run, so they cannot make an import cycle. They are
  collected apart (:attr:`Graph.typing_edges`), so that a type-only
  reference up the layers stays visible to whoever reads them;
- imports by name computed at run time (``importlib.import_module(name)``,
  as ``load_checks`` imports the suites) are not seen; a module importing
  itself is no edge.

A cycle is reported as the modules in import order, first one repeated at
the end (``a -> b -> a``), one per strongly connected component.
"""

from __future__ import annotations

import ast
import pkgutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import nemo_dist


@dataclass
class Graph:
    """Module names and their runtime import edges (``edges[a]``: the modules ``a`` imports), type-only apart."""

    modules: set[str] = field(default_factory=set)
    edges: dict[str, set[str]] = field(default_factory=dict)
    typing_edges: dict[str, set[str]] = field(default_factory=dict)


def _module_files(root: str, path: list[str]) -> dict[str, tuple[Path, bool]]:
    """Every module of package ``root`` (found on ``path``): its source file and whether it is a package.

    :func:`pkgutil.iter_modules`, level by level: unlike :func:`pkgutil.walk_packages`
    it imports nothing (walking ``nemo_dist.conformance`` would run its
    ``__init__``, which imports torch and every suite, and a cycle under test
    could break the walk itself).
    """
    found = {root: (Path(path[0]) / "__init__.py", True)}
    for info in pkgutil.iter_modules(path, prefix=f"{root}."):
        spec = info.module_finder.find_spec(info.name, None)
        assert spec is not None, info.name
        assert spec.origin is not None, info.name
        if info.ispkg:
            assert spec.submodule_search_locations, info.name
            found.update(_module_files(info.name, list(spec.submodule_search_locations)))
        else:
            found[info.name] = (Path(spec.origin), False)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` test is ``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement of ``tree``, anywhere in it, with whether it sits under ``if TYPE_CHECKING:``."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, typing_only))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(tree, False)
    return found


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that import ``node`` (in module ``name``) is an edge to."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if node.level:
        package = name if is_package else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if base not in modules:
        return set()
    return {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}


def import_graph(root: str, path: list[str]) -> Graph:
    """The import graph of package ``root`` whose ``__path__`` is ``path`` (see the module docstring).

    Nothing is imported: every module is read as source.
    """
    files = _module_files(root, path)
    graph = Graph(modules=set(files))
    for name, (source, is_package) in files.items():
        runtime, typing_only = graph.edges.setdefault(name, set()), graph.typing_edges.setdefault(name, set())
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
        for node, under_type_checking in _imports(tree):
            targets = _targets(node, name, is_package, graph.modules) - {name}
            (typing_only if under_type_checking else runtime).update(targets)
    return graph


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of ``edges`` with more than one module, sorted.

    Each is the modules in import order, starting at the component's first
    module by name and ending with it again (``[a, b, a]``: a imports b, b imports a).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for node in sorted(edges):
            if node not in index:
                connect(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(_cycle_in(component, edges) for component in components)


def _cycle_in(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the first module (by name) of a strongly connected ``component``."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for target in sorted(edges.get(node, set()) & component):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


#: The packages of nemo_dist that import one another, bottom to top (the components import neither of them).
PACKAGE_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the harness", ("nemo_dist.testing",)),
    ("the conformance package", ("nemo_dist.conformance",)),
    ("the console script", ("nemo_dist.command",)),
)
#: The components: the harness never imports them (it imports whatever implementation it is pointed at, by name).
COMPONENTS = ("nemo_dist.loss", "nemo_dist.distributed")
#: The folders of nemo_dist.conformance, bottom to top: each folder is a layer, and a module's layer is the folder
#: holding it. The package's ``__init__`` (``load_checks``, ``run_conformance``) stands between the suites and the
#: front ends, ``__main__`` above them.
CONFORMANCE_FOLDERS = ("engine", "adapters", "suites", "frontends")
CONFORMANCE_ROOT = Path(nemo_dist.__file__).parent / "conformance"


def conformance_layers() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The layers of nemo_dist.conformance read from its folders (each must be one of :data:`CONFORMANCE_FOLDERS`)."""
    folders = {p.name for p in CONFORMANCE_ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(CONFORMANCE_FOLDERS), f"place every folder in CONFORMANCE_FOLDERS: {sorted(folders)}"
    engine, adapters, suites, frontends = ((name, (name,)) for name in CONFORMANCE_FOLDERS)
    return engine, adapters, suites, ("the package", ("",)), frontends, ("the command's module", ("__main__",))


CONFORMANCE_LAYERS = conformance_layers()


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...], root: str = "") -> int | None:
    """The index of the layer naming ``module`` (itself or a package holding it; ``root.`` prefixed), or None."""
    best: tuple[int, int] | None = None
    for index, (_, names) in enumerate(layers):
        for name in names:
            full = ".".join(part for part in (root, name) if part)
            if (module == full or module.startswith(f"{full}.")) and (best is None or len(full) > best[0]):
                best = (len(full), index)
    return None if best is None else best[1]


def upward_imports(graph: Graph, layers: tuple[tuple[str, tuple[str, ...]], ...], root: str = "") -> list[str]:
    """Every runtime import of a module of a layer by a module of a lower one, as ``a (layer) imports b (layer)``."""
    found = []
    for module in sorted(graph.edges):
        low = layer_of(module, layers, root)
        for target in sorted(graph.edges[module]):
            high = layer_of(target, layers, root)
            if low is not None and high is not None and high > low:
                found.append(f"{module} ({layers[low][0]}) imports {target} ({layers[high][0]})")
    return found


def _described(found: list[list[str]]) -> str:
    return "\n".join(" -> ".join(cycle) for cycle in found)


@pytest.fixture(scope="module")
def graph() -> Graph:
    """The import graph of the installed nemo_dist, read from its source."""
    found = import_graph("nemo_dist", list(nemo_dist.__path__))
    assert "nemo_dist.conformance.engine.target" in found.modules  # the walk reached the subpackages
    return found


def test_nemo_dist_has_no_import_cycle(graph: Graph) -> None:
    """No chain of runtime imports (lazy ones inside functions included) leads from a nemo_dist module back to it."""
    found = cycles(graph.edges)
    assert not found, f"import cycles in nemo_dist (each: the modules in import order):\n{_described(found)}"


def test_conformance_imports_only_go_down_its_layers(graph: Graph) -> None:
    """A conformance module imports only modules of its layer or below (a suite never the package nor a front end)."""
    found = upward_imports(graph, CONFORMANCE_LAYERS, "nemo_dist.conformance")
    assert not found, "imports up the layers of nemo_dist.conformance:\n" + "\n".join(found)


def test_the_conformance_top_level_holds_only_the_public_front_and_folders() -> None:
    """``nemo_dist/conformance/`` holds ``__init__``, ``__main__`` and the layers' folders: every other module sits in
    the folder of its layer."""
    top = sorted(p.name for p in CONFORMANCE_ROOT.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name[0] != "_"))
    assert top == sorted(["__init__.py", "__main__.py", *CONFORMANCE_FOLDERS])


def test_the_harness_imports_go_down_and_never_reach_a_component(graph: Graph) -> None:
    """testing never imports conformance; neither imports a component, nor does a component import either."""
    found = upward_imports(graph, PACKAGE_LAYERS)
    sides = (("the harness", tuple(name for _, names in PACKAGE_LAYERS for name in names)), ("components", COMPONENTS))
    for module in sorted(graph.edges):
        for target in sorted(graph.edges[module]):
            side, other = layer_of(module, sides), layer_of(target, sides)
            if side is not None and other is not None and side != other:
                found.append(f"{module} ({sides[side][0]}) imports {target} ({sides[other][0]})")
    assert not found, "\n".join(found)


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def test_two_modules_importing_each_other_are_reported_as_a_cycle(tmp_path: Path) -> None:
    """The finder reports a real cycle, a lazy import inside a function included, with the modules in order."""
    _write(tmp_path, {
        "cyc/__init__.py": "",
        "cyc/a.py": "from cyc.b import helper\n",
        "cyc/b.py": "def helper():\n    from cyc import a\n    return a\n",
        "cyc/c.py": "from . import a\n",
    })
    graph = import_graph("cyc", [str(tmp_path / "cyc")])
    assert graph.edges["cyc.c"] == {"cyc.a"}  # relative import resolved to the module
    assert cycles(graph.edges) == [["cyc.a", "cyc.b", "cyc.a"]]


def test_a_longer_cycle_is_reported_in_import_order(tmp_path: Path) -> None:
    """A three-module cycle through a subpackage is named module by module, in the order the imports go."""
    _write(tmp_path, {
        "cyc/__init__.py": "",
        "cyc/sub/__init__.py": "",
        "cyc/sub/low.py": "import cyc.top\n",
        "cyc/mid.py": "from .sub import low\n",
        "cyc/top.py": "from cyc import mid\n",
    })
    graph = import_graph("cyc", [str(tmp_path / "cyc")])
    assert cycles(graph.edges) == [["cyc.mid", "cyc.sub.low", "cyc.top", "cyc.mid"]]


def test_a_package_init_importing_its_submodules_is_no_cycle(tmp_path: Path) -> None:
    """``__init__`` importing a submodule that imports a sibling through the package path is the normal shape."""
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg.low import base\nfrom pkg.high import top\nNAME = 1\n",
        "pkg/low.py": "base = 1\n",
        "pkg/high.py": "from pkg import low\nfrom pkg.low import base\ntop = base\n",
    })
    graph = import_graph("pkg", [str(tmp_path / "pkg")])
    assert graph.edges["pkg.high"] == {"pkg.low"}
    assert cycles(graph.edges) == []


def test_a_name_defined_in_a_package_init_is_an_edge_to_the_init(tmp_path: Path) -> None:
    """``from pkg import NAME`` (no submodule) is an edge to the package's ``__init__``: a cycle if it imports back."""
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg.high import top\nNAME = 1\n",
        "pkg/high.py": "from pkg import NAME\ntop = NAME\n",
    })
    graph = import_graph("pkg", [str(tmp_path / "pkg")])
    assert cycles(graph.edges) == [["pkg", "pkg.high", "pkg"]]


def test_type_checking_imports_are_kept_apart_and_make_no_cycle(tmp_path: Path) -> None:
    """An import under ``if TYPE_CHECKING:`` never runs: it is a typing edge, not a runtime one."""
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import Top\n",
        "pkg/high.py": "import typing\nfrom pkg.low import base\nif typing.TYPE_CHECKING:\n    import pkg.low\n",
    })
    graph = import_graph("pkg", [str(tmp_path / "pkg")])
    assert graph.edges["pkg.low"] == set()
    assert graph.typing_edges["pkg.low"] == {"pkg.high"}
    assert cycles(graph.edges) == []
    assert cycles({m: graph.edges[m] | graph.typing_edges[m] for m in graph.modules}) == [
        ["pkg.high", "pkg.low", "pkg.high"]
    ]


def test_an_import_up_the_layers_is_reported_and_one_down_is_not() -> None:
    """The layer rule names each import of a higher layer's module (a package standing for its modules)."""
    graph = Graph(
        modules={"p.low", "p.mid", "p.top.x"},
        edges={"p.low": {"p.top.x"}, "p.top.x": {"p.mid", "p.low"}, "p.mid": {"p.low"}},
    )
    layers = (("bottom", ("low",)), ("middle", ("mid",)), ("top", ("top",)))
    assert layer_of("p.top.x", layers, "p") == 2
    assert layer_of("p.other", layers, "p") is None
    assert upward_imports(graph, layers, "p") == ["p.low (bottom) imports p.top.x (top)"]


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        pytest.param({"a": {"b"}, "b": {"c"}, "c": set()}, [], id="a-chain-is-no-cycle"),
        pytest.param({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, [], id="a-diamond-is-no-cycle"),
        pytest.param(
            {"a": {"b"}, "b": {"a"}, "x": {"y"}, "y": {"x"}},
            [["a", "b", "a"], ["x", "y", "x"]],
            id="two-separate-cycles-are-both-reported",
        ),
    ],
)
def test_cycles_finds_exactly_the_strongly_connected_groups(
    edges: dict[str, set[str]], expected: list[list[str]]
) -> None:
    """The finder reports each cycle once and nothing for graphs without one."""
    assert cycles(edges) == expected
