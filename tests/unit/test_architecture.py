"""Dependencies point inward: waste.domain imports only the stdlib, attrs and itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
DOMAIN = SRC / "waste" / "domain"
FORBIDDEN = ("trio", "quart", "quart_trio", "hypercorn", "cffi", "waste.adapters", "waste.app",
             "httpx", "PIL")
THIRD_PARTY_ALLOWED = ("attrs", "attr")
DYNAMIC_IMPORTS = ("__import__", "import_module")


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


def imported_modules(path: Path, src: Path) -> set[str]:
    """Every module the file imports, at any depth (functions, classes, conditionals).

    ``from X import Y`` counts both X and X.Y, since Y may be a submodule
    (``from waste import adapters``); ``__import__``/``importlib.import_module`` with a
    literal name count too.
    """
    module = module_name(path, src)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "id", getattr(node.func, "attr", None)) in DYNAMIC_IMPORTS):
            names.add(node.args[0].value)
    return names


def allowed(name: str) -> bool:
    top = name.split(".")[0]
    return (top in sys.stdlib_module_names or top in THIRD_PARTY_ALLOWED or name == "waste"
            or name == "waste.domain" or name.startswith("waste.domain."))


def outward_imports(src: Path) -> list[str]:
    """``file: module`` for each import under src/waste/domain that leaves stdlib+attrs+domain."""
    domain = src / "waste" / "domain"
    return sorted(f"{path.relative_to(domain)}: {name}"
                  for path in domain.rglob("*.py")
                  for name in imported_modules(path, src) if not allowed(name))


def test_domain_sources_import_nothing_outward():
    assert len(list(DOMAIN.rglob("*.py"))) > 5
    assert outward_imports(SRC) == []


def test_the_check_catches_relative_nested_and_dynamic_imports(tmp_path):
    planted = tmp_path / "waste" / "domain" / "inner"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("from ... import app\n")
    (planted / "bad.py").write_text(
        "from __future__ import annotations\n"
        "import importlib\n"
        "from .. import errors\n"
        "from ..segments import Segment\n"
        "from ...adapters import fake\n"
        "def later():\n"
        "    import trio\n"
        "    if True:\n"
        "        from ...app.settings import Settings\n"
        "class C:\n"
        "    def m(self):\n"
        "        return importlib.import_module('cffi')\n"
        "from .... import beyond\n")
    assert outward_imports(tmp_path) == [
        "inner/__init__.py: waste.app",
        "inner/bad.py: <.... beyond the top-level package>",
        "inner/bad.py: <.... beyond the top-level package>.beyond",
        "inner/bad.py: cffi",
        "inner/bad.py: trio",
        "inner/bad.py: waste.adapters",
        "inner/bad.py: waste.adapters.fake",
        "inner/bad.py: waste.app.settings",
        "inner/bad.py: waste.app.settings.Settings",
    ]


def test_relative_imports_resolve_against_the_package(tmp_path):
    domain = tmp_path / "waste" / "domain"
    domain.mkdir(parents=True)
    (domain / "mod.py").write_text("from . import errors\nfrom .x import y\nfrom .. import app\n")
    assert imported_modules(domain / "mod.py", tmp_path) == {
        "waste.domain", "waste.domain.errors", "waste.domain.x", "waste.domain.x.y", "waste",
        "waste.app"}


def test_importing_the_whole_domain_loads_no_outer_layer():
    modules = [module_name(p, SRC) for p in DOMAIN.rglob("*.py")]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} "
              "or m.startswith(('waste.adapters', 'waste.app'))]\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# Records of marker ids, built positionally in marker order (``XtmlMarkerIds(*ids)``): the
# field order is their contract, so they stay positional.
POSITIONAL_BY_DESIGN = {"waste.domain.xtml.markers.XtmlMarkerIds",
                        "waste.domain.chatjson.k2tools.ToolMarkerIds"}


def test_attrs_classes_past_three_fields_are_keyword_only():
    import importlib
    import inspect

    import attrs

    offenders = []
    for path in sorted(DOMAIN.rglob("*.py")):
        module = importlib.import_module(module_name(path, SRC))
        for name, cls in vars(module).items():
            if not (inspect.isclass(cls) and attrs.has(cls)
                    and cls.__module__ == module.__name__):
                continue
            fields = [f for f in attrs.fields(cls) if f.init]
            qualified = f"{module.__name__}.{name}"
            if (len(fields) > 3 and any(not f.kw_only for f in fields)
                    and qualified not in POSITIONAL_BY_DESIGN):
                offenders.append(qualified)
    assert offenders == []
