"""The layout shows the architecture: the packages import each other without a loop and the
modules without a circle, the top level holds only its allowed modules (a new one goes into a
package), the core below every package imports nothing above it, the model knows nothing of
decoding, I/O or the command line, and the command line stays thin."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "evspark_cli"
TOP_LEVEL = {"__init__", "alphabet", "api", "bundled", "cgroups", "cpus", "defaults", "errors",
             "files", "limits"}
"""The only modules directly in evspark_cli/: the core every package may use and the two modules
above the packages (TOP). A new module goes into a package (cli, decode, eval, generation, io,
model, train, or a new one), never beside these."""
TOP = {"evspark_cli.api", "evspark_cli.limits"}
"""The top-level modules above the packages, which only the command line imports: the Python API
(`api`) and the limits a command checks a run against (`limits`: context, memory). The other
top-level modules (`__init__`, whose names resolve lazily, alphabet, bundled, cgroups, cpus,
defaults, errors, files) are the core: they import only each other."""


def _module(path: Path) -> str:
    """The module a file is: evspark_cli/io/fasta.py is evspark_cli.io.fasta, and
    evspark_cli/io/__init__.py is evspark_cli.io."""
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PKG.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level(stmts: list) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported: at its top level, in classes,
    `try`, `with`, loops and `if` blocks, but not in functions nor under `if TYPE_CHECKING:`."""
    for s in stmts:
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            yield s
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(s, ast.If) and _is_type_checking(s.test):
            yield from _module_level(s.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(s, field, None) or []:
                    yield from _module_level(child.body if hasattr(child, "pattern") or
                                             isinstance(child, ast.ExceptHandler) else [child])


def _imports(path: Path, module_level: bool = False) -> set[str]:
    """evspark_cli modules a file imports (relative imports resolved; `from X import Y` imports
    the module X.Y where there is one), at any depth or only at module level."""
    tree = ast.parse(path.read_text())
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    package = parts[:-1]  # the package a relative import starts from
    found = set()
    for node in _module_level(tree.body) if module_level else ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            for alias in node.names:
                found.add(f"{name}.{alias.name}" if f"{name}.{alias.name}" in MODULES else name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name not in MODULES and "." in name:
                    name = name.rsplit(".", 1)[0]
                found.add(name)
    return {n for n in found if n == "evspark_cli" or n.startswith("evspark_cli.")}


def _area(module: str) -> str:
    """The area a module belongs to: its package (evspark_cli.train.corpus -> train); the
    top-level modules are one area, "core", but for those above the packages ("top", TOP)."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (PKG / parts[1]).is_dir()):
        return parts[1]
    return "top" if module in TOP else "core"


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        src = _area(module)
        for target in _imports(path):
            dst = _area(target)
            if dst != src:
                graph.setdefault(src, set()).add(dst)
    return graph


def test_packages_import_each_other_without_a_loop():
    """Imports at any depth (a function's lazy import too): the core imports only the core, the
    top (the Python API, the run limits) is imported only by the command line, and no package
    needs itself through others."""
    graph = _package_graph()
    above = {f"{m} -> {t}" for m, p in MODULES.items() if _area(m) == "core"
             for t in sorted(_imports(p)) if _area(t) != "core"}
    assert not above, f"core modules import from above the core: {sorted(above)}"
    users = sorted(a for a, deps in graph.items() if "top" in deps and a != "cli")
    assert not users, f"only the command line imports {sorted(TOP)}, not {users}"

    def reach(a: str, seen: set[str]) -> set[str]:
        for b in graph.get(a, ()):
            if b not in seen:
                seen.add(b)
                reach(b, seen)
        return seen

    loops = sorted(a for a in graph if a in reach(a, set()))
    assert not loops, {a: sorted(graph[a]) for a in loops}
    assert not graph.get("model", set()) & {"decode", "io", "eval", "train", "cli", "top"}
    assert "cli" not in set().union(*graph.values())  # nothing depends on the command line


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a -> ... -> a, shortest through its first module) per strongly connected set
    of modules of the graph, in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    sets: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan; the package has far fewer modules than the recursion limit
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = set()
            while True:
                w = stack.pop()
                members.add(w)
                if w == v:
                    break
            if len(members) > 1:
                sets.append(members)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for members in sorted(sets, key=min):
        first = min(members)
        paths, seen = [[first]], {first}
        while paths:  # breadth first: the shortest way back to `first` inside the set
            path = paths.pop(0)
            nxt = sorted(graph[path[-1]] & members)
            if first in nxt:
                circles.append([*path, first])
                break
            for w in nxt:
                if w not in seen:
                    seen.add(w)
                    paths.append([*path, w])
    return circles


def test_modules_import_each_other_without_a_circle():
    """The imports that run when a module is imported (module level: not in functions, not under
    `if TYPE_CHECKING:`) never come back to the module: importing any module first never finds
    another half-initialised. A function's lazy import may close a circle; the statement may not."""
    graph = {m: _imports(p, module_level=True) - {m} for m, p in MODULES.items()}
    circles = _circles(graph)
    assert not circles, "module-level import circles: " + "; ".join(" -> ".join(
        m.removeprefix("evspark_cli.") for m in c) for c in circles)


def test_a_new_module_goes_into_a_package():
    """evspark_cli/ holds only the modules of TOP_LEVEL (the core: __init__, alphabet, bundled,
    cgroups, cpus, defaults, errors, files; above the packages: api, limits); a new module goes
    into a package (cli, decode, eval, generation, io, model, train, or a new one), not beside
    them."""
    top = {p.stem for p in PKG.glob("*.py")}
    assert top <= TOP_LEVEL, (f"{sorted(top - TOP_LEVEL)} in evspark_cli/: a new module goes into "
                              f"a package, the top level holds only {sorted(TOP_LEVEL)}")


def test_the_command_line_is_thin():
    """One module per command; none over 300 lines, no function over 80."""
    for path in (PKG / "cli").glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 300, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                assert node.end_lineno - start + 1 <= 80, f"{path.name}: {node.name}"
