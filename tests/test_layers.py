"""The package's import graph: no circles, and every import points down the layers.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import`` of
an ``espresso`` module counts, at module level, inside functions (lazy imports) and under
``TYPE_CHECKING`` alike. Importing ``espresso.a.b`` also runs the package ``espresso.a``'s
``__init__``, so a module depends on its subpackage too (the root package is the public
facade on top of everything; importing anything runs it first). The layers are those of
docs/development.md, "Layers".
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).parents[1] / "espresso"

# Bottom to top: a module may import its own layer and the ones below it, never above.
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", ["espresso.errors", "espresso.units", "espresso._io", "espresso._validate",
                    "espresso._optional", "espresso._native", "espresso._core"]),
    ("contracts", ["espresso.model", "espresso.job", "espresso.cost", "espresso.modules",
                   "espresso.profile", "espresso.estimate_result", "espresso.gpu_type",
                   "espresso.cloud", "espresso.cloud.specs", "espresso.cloud.networks",
                   "espresso.cloud.spot_terms", "espresso.cloud.offers",
                   "espresso.cloud.skypilot"]),
    ("catalog", ["espresso.catalog", "espresso.cloud.quota", "espresso.cloud.spot",
                 "espresso.cloud.domains", "espresso.cloud.snapshot", "espresso.cloud.prices",
                 "espresso.table"]),
    ("cost model", ["espresso.estimate", "espresso.plan", "espresso.interleave",
                    "espresso.engines"]),
    ("search", ["espresso.progress", "espresso.scheduler", "espresso.search",
                "espresso.frontier", "espresso.baselines", "espresso.prototype_source",
                "espresso._prototype_runner"]),
    ("runner", ["espresso.runner", "espresso.runner.*", "espresso.launch", "espresso.torch"]),
    ("training", ["espresso.train", "espresso.train.*"]),
    ("tools", ["espresso.bench", "espresso.bench.*", "espresso.plot", "espresso.calibrate",
               "espresso.gpu", "espresso.cloud.skypilot_export", "espresso.export",
               "espresso.export.*"]),
    ("interface", ["espresso.cli", "espresso.cli.*", "espresso"]),
]


def modules() -> dict[str, Path]:
    out = {}
    for p in [*PKG.rglob("*.py"), *PKG.rglob("*.pyi")]:
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.setdefault(".".join(parts), p)
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The espresso modules ``name`` imports, anywhere in its source."""
    if path.suffix == ".pyi":
        return set()  # the compiled core's stub
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "espresso")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "espresso":
                continue
            for a in node.names:  # `from pkg import module` imports the module
                out.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod)
    return out


def graph(*, packages: bool = True) -> dict[str, set[str]]:
    """Module -> the espresso modules it imports; ``packages``: and its subpackage."""
    mods = modules()
    known = set(mods)
    g: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = {d for d in imports_of(name, path, known) if d in known}
        parent = name.rpartition(".")[0]
        if packages and parent and parent != "espresso":
            deps.add(parent)  # its subpackage's __init__ runs first
        deps.discard(name)
        g[name] = deps
    return g


def within_one_package(comp: list[str]) -> bool:
    """A circle of a package's ``__init__`` with its own modules (it imports them to export
    their names): harmless, Python enters the package before its modules."""
    top = min(comp, key=len)
    return all(m == top or m.startswith(top + ".") for m in comp)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def layer_of(name: str) -> int:
    for i, (_, pats) in enumerate(LAYERS):
        for pat in pats:
            if name == pat or (pat.endswith(".*") and name.startswith(pat[:-1])):
                return i
    msg = f"{name} is in no layer: add it to LAYERS and docs/development.md"
    raise AssertionError(msg)


def test_the_graph_is_read() -> None:
    g = graph()
    # Spot checks that the reader sees each kind of import.
    assert "espresso.catalog" in g["espresso.cloud.domains"]            # from ..catalog import
    assert "espresso.runner.stage" in g["espresso.runner.checkpoint"]   # under TYPE_CHECKING
    assert "espresso.cloud" in g["espresso.cloud.offers"]               # its package
    assert "espresso.calibrate" in g["espresso.cli.measure"]            # lazy, `from .. import`


def test_the_checker_finds_a_circle() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    # Between modules, directly or through lazy imports:
    found = cycles(graph(packages=False))
    # Through a subpackage's __init__, leaving the package (importing espresso.cloud.offers
    # runs espresso/cloud/__init__.py, so it must not reach back to the importer):
    found += [c for c in cycles(graph()) if not within_one_package(c)]
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_a_circle_through_a_package_is_found() -> None:
    # catalog -> cloud.offers -> (its package) cloud -> cloud.domains -> catalog
    g = {"espresso.catalog": {"espresso.cloud.offers"},
         "espresso.cloud.offers": {"espresso.cloud"},
         "espresso.cloud": {"espresso.cloud.domains"},
         "espresso.cloud.domains": {"espresso.catalog", "espresso.cloud"}}
    (c,) = cycles(g)
    assert not within_one_package(c)
    # a package exporting its own modules' names is not one
    (c,) = cycles({"p.q": {"p.q.a"}, "p.q.a": {"p.q"}})
    assert within_one_package(c)


def test_every_module_has_a_layer() -> None:
    for name in graph():
        layer_of(name)


@pytest.mark.parametrize("layer", [name for name, _ in LAYERS])
def test_imports_point_down(layer: str) -> None:
    g = graph()
    bad = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
           for m in sorted(g) if LAYERS[layer_of(m)][0] == layer
           for d in sorted(g[m]) if layer_of(d) > layer_of(m)]
    assert not bad, "imports up the layers:\n" + "\n".join(bad)


def test_only_native_imports_the_compiled_core() -> None:
    g = graph(packages=False)
    assert sorted(m for m, deps in g.items() if "espresso._core" in deps) == ["espresso._native"]
