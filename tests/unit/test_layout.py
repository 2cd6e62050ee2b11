"""The package's layout (docs/architecture.md): no import circles, the core free of SGLang,
no module over 400 lines in the product or the benchmarks, and the package map in
docs/architecture.md matching the tree. Read with ast; nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "sglang_spec_ext"
#: Engine-agnostic packages: no SGLang and nothing of sglang_spec_ext.sglang, anywhere.
CORE = ("suffix", "adaptive", "hybrid", "verify", "models")
MAX_LINES = 400


def _modules(pkg: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under ``pkg`` (packages by their
    ``__init__``)."""
    mods = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = path.relative_to(pkg.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imported(mod: str, path: Path, tree: ast.AST) -> list[tuple[str, int]]:
    """(dotted target, depth) of every import in ``tree``; depth 0 = module level."""
    is_pkg = path.name == "__init__.py"
    here = mod.split(".") if is_pkg else mod.split(".")[:-1]
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            inner = depth + isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                out.extend((a.name, depth) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here[: len(here) - child.level + 1] + [child.module or ""]
                    target = ".".join(p for p in base if p)
                else:
                    target = child.module or ""
                out.append((target, depth))
                out.extend((f"{target}.{a.name}", depth) for a in child.names)
            visit(child, inner)

    visit(tree, 0)
    return out


def import_graph(pkg: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``pkg`` it imports (module or function level); an import
    of a name resolves to the deepest module of the package it names. A module's own
    parent packages are not edges (importing a sub-module runs them anyway)."""
    mods = _modules(pkg)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for target, _depth in _imported(mod, path, ast.parse(path.read_text())):
            while target and target not in mods and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in mods and target != mod and not mod.startswith(target + "."):
                edges[mod].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_circle_finder_finds_a_planted_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "demo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from demo.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from demo.c import g\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text("from demo import a\n")
    assert circles(import_graph(pkg)) == [["demo.a", "demo.c", "demo.sub.b"]]


def test_no_import_circles_in_the_package() -> None:
    found = circles(import_graph(PKG))
    assert not found, "import circles (each a strongly connected set of modules):\n" + "\n".join(
        ", ".join(c) for c in found
    )


def test_only_the_host_bridge_imports_sglang() -> None:
    """Outside ``sglang_spec_ext/sglang/`` nothing imports SGLang, even lazily; the core
    packages import nothing of ``sglang_spec_ext.sglang`` either, and the root and the
    tools reach it only inside functions (lazily, where a command needs the host)."""
    bad = []
    for mod, path in _modules(PKG).items():
        parts = mod.split(".")
        if parts[1:2] == ["sglang"]:
            continue
        core = len(parts) > 1 and parts[1] in CORE
        for target, depth in _imported(mod, path, ast.parse(path.read_text())):
            if target == "sglang" or target.startswith("sglang."):
                bad.append(f"{mod} imports the host ({target})")
            elif target.startswith("sglang_spec_ext.sglang") and (core or depth == 0):
                bad.append(f"{mod} imports {target}" + ("" if core else " at module level"))
    assert not bad, "\n".join(sorted(set(bad)))


@pytest.mark.parametrize("folder", ["sglang_spec_ext", "benchmarks"])
def test_no_module_over_400_lines(folder: str) -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / folder).rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def _documented_packages() -> list[str]:
    """Package paths (relative to sglang_spec_ext/) named in docs/architecture.md's map:
    the first fenced block of its Architecture section, one package a line."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Architecture", 1)[1]
    block = section.split("```", 2)[1]
    names = []
    for line in block.splitlines()[1:]:
        m = re.match(r"\s*([\w/]+)/\s", line)
        if m:
            names.append(m.group(1))
    return names


def test_the_architecture_map_matches_the_tree() -> None:
    documented = _documented_packages()
    assert documented[0] == "sglang_spec_ext"
    named = set(documented[1:])
    actual = {str(p.parent.relative_to(PKG)) for p in PKG.rglob("__init__.py") if p.parent != PKG}
    assert sorted(named - actual) == [], "docs/architecture.md names packages that do not exist"
    assert sorted(actual - named) == [], "packages missing from docs/architecture.md's map"
    assert len(documented) == len(set(documented)), "a package is named twice"
