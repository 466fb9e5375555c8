"""The package's layers import downward only, and no two modules import each other in a circle.

Every ``import`` of every module counts, at its top, inside a function or under
``TYPE_CHECKING``: a function-level import is still a dependency, only a later
one.  The rules, each checked below:

- ``rundir/`` (the run directory contract) imports nothing else of shardtop;
- ``read/`` (the fold, the read model, the facts) imports only ``rundir/`` and
  the small helpers;
- ``probe/``, ``inject/``, ``runner/``, ``plan/`` and ``trace/`` never import ``read/``;
- ``plan/`` is the plan's arithmetic: it imports no torch and no engine, and
  nothing of ``runner/``, ``inject/`` or ``trace/`` (the model traced on the
  meta device);
- ``trace/`` never imports ``inject/`` (the bootstrap imports ``trace/``);
- ``read/``, ``diagnose/``, ``report/`` and ``tui/`` never import ``trace/``;
- nothing imports ``tui/`` but ``cli``;
- ``export/`` reads runs as the report does: ``rundir/``, ``read/``, ``diagnose/``, the GPUs' sampler and
  the helpers, and no training library.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.support.cli import ROOT

PACKAGE = ROOT / "shardtop"
HELPERS = frozenset({"shardtop.collector", "shardtop.units", "shardtop.words"})
"""Small pure modules any layer may use."""
ENGINES = ("torch", "lightning", "pytorch_lightning", "deepspeed", "transformers", "accelerate", "peft")


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported_names(name: str) -> Iterator[str]:
    """What each import statement of module ``name`` brings in, as absolute names: ``from a import b``
    is ``a.b`` where that is a module of the package, else ``a``."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                yield submodule if submodule in modules() else source


def _module_of(name: str) -> str | None:
    """The module of the package that ``name`` is or lies in; None outside the package."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


@cache
def imports(name: str) -> frozenset[str]:
    """The package's modules that module ``name`` imports, anywhere in its body."""
    return frozenset(m for n in _imported_names(name) if (m := _module_of(n)) is not None) - {name}


def imports_outside(name: str) -> frozenset[str]:
    """The top-level names of everything module ``name`` imports (``torch``, ``shardtop``...)."""
    return frozenset(n.split(".")[0] for n in _imported_names(name))


def layer(name: str) -> str:
    """``shardtop.read.run_model`` -> ``read``; a top-level module is its own layer (``cli``)."""
    return name.split(".")[1] if name.count(".") else ""


def in_layer(*layers: str) -> list[str]:
    return [m for m in modules() if layer(m) in layers]


def engine_code(side: str) -> frozenset[str]:
    """The modules of ``side`` that import torch or an engine, or bring in ``runner/``, ``inject/`` or ``trace/``."""
    return frozenset(
        m for m in in_layer(side)
        if imports_outside(m) & set(ENGINES) or any(layer(i) in ("runner", "inject", "trace") for i in imports(m))
    )


def traced_model_code() -> frozenset[str]:
    """The plan's torch side: ``trace/``, and whatever of ``plan/`` imports torch, an engine or an upper layer."""
    return frozenset(in_layer("trace")) | engine_code("plan")


def broken(importers: list[str], allowed: object) -> list[str]:
    """``importer -> imported`` for every import of ``importers`` that ``allowed(importer, imported)`` refuses."""
    return sorted(f"{m} -> {i}" for m in importers for i in imports(m) if not allowed(m, i))  # type: ignore[operator]


def test_the_layers_are_there() -> None:
    assert {"rundir", "read", "diagnose", "report", "tui", "plan", "trace", "probe", "inject", "runner"} <= {
        layer(m) for m in modules()
    }
    assert {"shardtop.read.run_model", "shardtop.rundir.events", "shardtop.rundir.run_directory"} <= set(modules())
    assert imports("shardtop.read.run_model"), "the parser finds the read model's imports"
    assert "shardtop.trace.describe" in traced_model_code()
    assert "shardtop.trace.recipes" in engine_code("trace"), "a function-level import of runner/ counts"
    assert "torch" in imports_outside("shardtop.trace.meta"), "the parser finds torch"


def test_the_run_directory_imports_nothing_else_of_shardtop() -> None:
    assert broken(in_layer("rundir"), lambda m, i: layer(i) == "rundir") == []


def test_the_read_side_imports_only_the_run_directory_and_the_helpers() -> None:
    assert broken(in_layer("read"), lambda m, i: layer(i) in ("rundir", "read") or i in HELPERS) == []


@pytest.mark.parametrize("side", ["probe", "inject", "runner", "plan", "trace"])
def test_the_writing_side_never_imports_the_read_side(side: str) -> None:
    assert broken(in_layer(side), lambda m, i: layer(i) != "read") == []


def test_the_plan_is_arithmetic_and_imports_neither_torch_nor_an_upper_layer() -> None:
    """``plan/`` imports no torch or engine and nothing of ``runner/``, ``inject/`` or ``trace/``, not even
    inside a function: the TUI replans with it on every key, and the bootstrap imports it in the user's ranks."""
    assert [f"{m} imports {', '.join(sorted(imports_outside(m) & set(ENGINES)))}"
            for m in sorted(in_layer("plan")) if imports_outside(m) & set(ENGINES)] == []
    assert broken(in_layer("plan"), lambda m, i: layer(i) not in ("runner", "inject", "trace")) == []
    assert engine_code("plan") == frozenset()


def test_the_traced_model_never_imports_the_bootstrap() -> None:
    """``inject/`` imports ``trace/`` to trace the user's model in its ranks; never the other way round."""
    assert broken(in_layer("trace"), lambda m, i: layer(i) != "inject") == []


@pytest.mark.parametrize("side", ["read", "diagnose", "report", "tui"])
def test_the_views_never_import_the_traced_model(side: str) -> None:
    traced = traced_model_code()
    assert broken(in_layer(side), lambda m, i: i not in traced) == []


def test_nothing_imports_the_tui_but_the_cli() -> None:
    others = [m for m in modules() if layer(m) != "tui" and m != "shardtop.cli"]
    assert broken(others, lambda m, i: layer(i) != "tui") == []


EXPORT_MAY_IMPORT = frozenset({"rundir", "read", "diagnose", "export"})


def test_the_exporter_reads_runs_as_the_report_does_and_imports_no_training_library() -> None:
    exporter = in_layer("export")
    assert exporter, "the exporter is there"
    allowed = HELPERS | {"shardtop.gpus"}
    assert broken(exporter, lambda m, i: layer(i) in EXPORT_MAY_IMPORT or i in allowed) == []
    assert [m for m in exporter if imports_outside(m) & set(ENGINES)] == []


def test_no_import_circle() -> None:
    """Tarjan's strongly connected components of the import graph: each must be one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(imports(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(modules()):
        if name not in index:
            visit(name)
    assert circles == []


def test_no_test_imports_another_test_module() -> None:
    """What the test layers share lives in tests/support (tests/conftest.py names the layers): a test module,
    or a layer's conftest, imported by another would run its fixtures and hooks where nobody asked for them."""
    tests = ROOT / "tests"
    found = []
    for path in sorted(tests.rglob("*.py")):
        if "fixtures" in path.relative_to(tests).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                parts = name.split(".")
                if parts[0] == "tests" and len(parts) > 2 and parts[1] in ("unit", "engines", "tui"):
                    found.append(f"{path.relative_to(ROOT)} imports {name}")
    assert found == []
