"""The package's layers point one way: every import of a localspec module (top level, inside a function, or under
TYPE_CHECKING) goes to the same layer or one below it. The AST is read; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "localspec"

# Lowest first. A part (a subpackage or a top-level module of localspec) may import its own layer or any below.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"<root>", "config", "measured", "testing"}),  # measured: the figures read from assets/
    frozenset({"runtime", "structured"}),  # sampling, token trees, model runner and its cache; grammars and tool calls
    frozenset({"heads", "verify"}),
    frozenset({"proposers"}),  # sit on heads (the EAGLE/MTP head proposer)
    frozenset({"engine"}),
    frozenset({"models"}),
    frozenset({"store", "distill"}),
    frozenset({"chat", "bench"}),
    frozenset({"server"}),
    frozenset({"ui"}),
    frozenset({"cli"}),
    frozenset({"__main__"}),
)
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, package_dir: Path = PACKAGE) -> set[str]:
    """The absolute names of the localspec modules `path` imports (relative imports resolved)."""
    name = module_name(path, package_dir)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - (node.level - 1)] + [node.module or ""])
            else:
                base = node.module or ""
            base = base.rstrip(".")
            if base == "localspec":  # `from localspec import engine` names the part in the alias
                found.update(f"{base}.{alias.name}" for alias in node.names)
            else:
                found.add(base)
    return {module for module in found if module == "localspec" or module.startswith("localspec.")}


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def upward_edges(package: Path = PACKAGE) -> list[str]:
    edges = []
    for path in sorted(package.rglob("*.py")):
        source = module_name(path, package)
        for target in sorted(imported_modules(path, package)):
            if RANK[part_of(target)] > RANK[part_of(source)]:
                edges.append(f"{source} → {target}")
    return edges


def test_every_part_has_a_layer():
    parts = {part_of(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert parts <= RANK.keys(), f"give these parts a layer in LAYERS: {sorted(parts - RANK.keys())}"


def test_no_module_imports_a_layer_above_it():
    edges = upward_edges()
    assert not edges, "imports that run up the layers:\n" + "\n".join(edges)


def test_the_walk_sees_upward_imports(tmp_path):
    """The check can fail: relative, absolute, in-function and `from localspec import x` imports are all read."""
    package = tmp_path / "localspec"
    (package / "runtime").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "runtime" / "__init__.py").write_text("from localspec import ui\n")
    (package / "runtime" / "bad.py").write_text("import localspec.chat\n\ndef f():\n    from ..engine import loop\n")
    (package / "runtime" / "fine.py").write_text("from . import bad\nfrom localspec.config import ConfigError\n")
    assert upward_edges(package) == [
        "localspec.runtime → localspec.ui",
        "localspec.runtime.bad → localspec.chat",
        "localspec.runtime.bad → localspec.engine",
    ]
