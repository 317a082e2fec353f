"""The layout shows the architecture: the packages import each other without a loop, the model
knows nothing of decoding, I/O or the command line, and the command line stays thin."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "evspark_cli"


def _imports(path: Path) -> set[str]:
    """evspark_cli modules a file imports (relative imports resolved), at any depth."""
    module = path.relative_to(PKG.parent).with_suffix("").parts
    package = module[:-1]  # the package a relative import starts from
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {n for n in found if n == "evspark_cli" or n.startswith("evspark_cli.")}


def _area(module: str) -> str:
    """The package a module belongs to: evspark_cli.train.corpus -> train; top-level -> its name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "evspark_cli"


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        src = _area(".".join(path.relative_to(PKG.parent).with_suffix("").parts))
        for target in _imports(path):
            dst = _area(target)
            if dst != src and dst != "evspark_cli":
                graph.setdefault(src, set()).add(dst)
    return graph


def test_packages_import_each_other_without_a_loop():
    graph = _package_graph()

    def reach(a: str, seen: set[str]) -> set[str]:
        for b in graph.get(a, ()):
            if b not in seen:
                seen.add(b)
                reach(b, seen)
        return seen

    loops = sorted(a for a in graph if a in reach(a, set()))
    assert not loops, {a: sorted(graph[a]) for a in loops}
    assert not graph.get("model", set()) & {"decode", "io", "eval", "train", "cli", "api"}
    assert "cli" not in set().union(*graph.values())  # nothing depends on the command line


def test_the_command_line_is_thin():
    """One module per command; none over 300 lines, no function over 80."""
    for path in (PKG / "cli").glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 300, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                assert node.end_lineno - start + 1 <= 80, f"{path.name}: {node.name}"
