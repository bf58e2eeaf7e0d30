"""The import rules of the layout, as functions over a source tree (``src`` holding ``waste/``).

Each rule returns its violations as sorted ``"module: imported"`` strings, so the same checker
runs on the real tree and on the planted trees that prove it fails. Imports are read from the
AST at any depth (functions, ``if TYPE_CHECKING``), relative ones resolved, and
``__import__``/``importlib.import_module`` with a literal name count too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

THIRD_PARTY_IN_DOMAIN = ("attrs", "attr")
THIRD_PARTY_IN_SERVICE = ("attrs", "attr", "trio")
DYNAMIC_IMPORTS = ("__import__", "import_module")
# Entry points that may choose adapters: the composition root, and the command-line tools
# (each tool is the composition root of its own program, e.g. ``tools.eval`` opens libwaste).
ADAPTER_CHOOSERS = ("waste.app", "waste.tools")


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _from_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from`` import names, its dots resolved against ``package``."""
    if node.level == 0:
        return node.module or ""
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        return f"<{'.' * node.level} beyond the top-level package>"
    base = ".".join(parts[:len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _import_statements(path: Path, src: Path) -> list[tuple[str, str | None]]:
    """(module, name) per imported name: ``from X import Y`` is (X, Y), ``import X`` and a
    literal dynamic import are (X, None). At any depth (functions, classes, conditionals)."""
    module = module_name(path, src)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            found += [(base, alias.name if alias.name != "*" else None) for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "id", getattr(node.func, "attr", None)) in DYNAMIC_IMPORTS):
            found.append((node.args[0].value, None))
    return found


def imported_modules(path: Path, src: Path) -> set[str]:
    """Every module the file imports, at any depth.

    ``from X import Y`` counts both X and X.Y, since Y may be a submodule
    (``from waste import adapters``).
    """
    names = set()
    for base, name in _import_statements(path, src):
        names.add(base)
        if name is not None:
            names.add(f"{base}.{name}")
    return names


def _sources(src: Path, package: str = "waste") -> dict[str, Path]:
    root = src.joinpath(*package.split("."))
    return {module_name(path, src): path for path in sorted(root.rglob("*.py"))}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations(src: Path, package: str, bad) -> list[str]:
    return sorted(f"{module}: {name}"
                  for module, path in _sources(src, package).items()
                  for name in imported_modules(path, src) if bad(module, name))


def domain_outward_imports(src: Path) -> list[str]:
    """The domain imports only the standard library, attrs and itself."""
    def bad(module: str, name: str) -> bool:
        top = name.split(".")[0]
        return not (top in sys.stdlib_module_names or top in THIRD_PARTY_IN_DOMAIN
                    or name == "waste" or _within(name, "waste.domain"))
    return _violations(src, "waste.domain", bad)


def service_outward_imports(src: Path) -> list[str]:
    """The service imports only the standard library, attrs, trio, the domain and itself."""
    def bad(module: str, name: str) -> bool:
        top = name.split(".")[0]
        return not (top in sys.stdlib_module_names or top in THIRD_PARTY_IN_SERVICE
                    or name == "waste" or _within(name, "waste.domain")
                    or _within(name, "waste.service"))
    return _violations(src, "waste.service", bad)


def _adapter_of(name: str) -> str | None:
    """The adapter a module belongs to: ``waste.adapters.X`` for any module under it."""
    parts = name.split(".")
    return ".".join(parts[:3]) if len(parts) >= 3 and parts[:2] == ["waste", "adapters"] else None


def adapter_cross_imports(src: Path) -> list[str]:
    """No adapter imports another adapter."""
    def bad(module: str, name: str) -> bool:
        theirs = _adapter_of(name)
        return theirs is not None and theirs != _adapter_of(module)
    return _violations(src, "waste.adapters", bad)


def adapter_importers(src: Path) -> list[str]:
    """Only the composition root (and the tools' own entry points) import adapters."""
    def bad(module: str, name: str) -> bool:
        return (_within(name, "waste.adapters") and not _within(module, "waste.adapters")
                and not any(_within(module, root) for root in ADAPTER_CHOOSERS))
    return _violations(src, "waste", bad)


def import_graph(src: Path) -> dict[str, set[str]]:
    """module -> the modules of the tree it imports explicitly.

    A package's ``__init__`` is the package's name. ``from X import Y`` is an edge to X.Y
    when that is a module, else to X; the parent packages Python runs implicitly are not
    edges. Compiled extensions (``_libwaste``) are modules without imports.
    """
    sources = _sources(src)
    modules = set(sources) | {module_name(path.with_name(path.name.split(".")[0] + ".py"), src)
                              for path in (src / "waste").rglob("*.so")}
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        targets = set()
        for base, name in _import_statements(path, src):
            target = f"{base}.{name}" if name is not None and f"{base}.{name}" in modules else base
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def import_cycles(src: Path) -> list[str]:
    """Every import cycle under src/waste, one line per cycle (its modules, sorted)."""
    graph = import_graph(src)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[str] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(" <-> ".join(sorted(component)))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(cycles)
