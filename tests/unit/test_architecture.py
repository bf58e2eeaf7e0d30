"""Dependencies point inward, and the rules that say so are proven to catch a violation.

domain <- ports <- service <- adapters <- app: the domain imports only the stdlib, attrs and
itself; the service only those, trio and the domain; no adapter imports another adapter; only
the composition root (and the tools' entry points) import adapters; no import cycles anywhere
under src/waste. Each rule also runs on a planted tree in tmp_path, which it must refuse.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.unit.architecture import (adapter_cross_imports, adapter_importers,
                                     domain_outward_imports, import_cycles, imported_modules,
                                     module_name, service_outward_imports)

SRC = Path(__file__).resolve().parents[2] / "src"
DOMAIN = SRC / "waste" / "domain"
FORBIDDEN = ("trio", "quart", "quart_trio", "hypercorn", "cffi", "waste.adapters", "waste.app",
             "waste.service", "httpx", "PIL")


def planted(tmp_path: Path, files: dict[str, str]) -> Path:
    """A tiny source tree under ``tmp_path``: ``{"waste/x/y.py": "source"}``."""
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


# -- the real tree ------------------------------------------------------------------------------

def test_domain_sources_import_nothing_outward():
    assert len(list(DOMAIN.rglob("*.py"))) > 5
    assert domain_outward_imports(SRC) == []


def test_the_service_depends_on_the_ports_only():
    assert list((SRC / "waste" / "service").rglob("*.py"))
    assert service_outward_imports(SRC) == []


def test_no_adapter_imports_another_adapter():
    assert adapter_cross_imports(SRC) == []


def test_only_the_composition_root_imports_adapters():
    assert adapter_importers(SRC) == []


def test_no_import_cycles_under_src_waste():
    assert import_cycles(SRC) == []


# -- each rule refuses a planted violation --------------------------------------------------------


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
    assert domain_outward_imports(tmp_path) == [
        "waste.domain.inner.bad: <.... beyond the top-level package>",
        "waste.domain.inner.bad: <.... beyond the top-level package>.beyond",
        "waste.domain.inner.bad: cffi",
        "waste.domain.inner.bad: trio",
        "waste.domain.inner.bad: waste.adapters",
        "waste.domain.inner.bad: waste.adapters.fake",
        "waste.domain.inner.bad: waste.app.settings",
        "waste.domain.inner.bad: waste.app.settings.Settings",
        "waste.domain.inner: waste.app",
    ]


def test_the_service_rule_refuses_an_adapter_or_quart(tmp_path):
    src = planted(tmp_path, {
        "waste/service/__init__.py": "import trio\nfrom waste.domain.ports import Engine\n",
        "waste/service/bad.py": "from quart import request\n"
                                "def later():\n    from waste.adapters.fake import FakeEngine\n",
    })
    assert service_outward_imports(src) == [
        "waste.service.bad: quart", "waste.service.bad: quart.request",
        "waste.service.bad: waste.adapters.fake", "waste.service.bad: waste.adapters.fake.FakeEngine"]


def test_the_adapter_rule_refuses_one_adapter_importing_another(tmp_path):
    src = planted(tmp_path, {
        "waste/adapters/__init__.py": "",
        "waste/adapters/images.py": "from waste.domain.ports import PromptImage\n",
        "waste/adapters/http/__init__.py": "",
        "waste/adapters/http/routes.py": "from waste.adapters.http import state\n"
                                         "from waste.adapters import images\n",
        "waste/adapters/fake/engine.py": "from ..http.routes import register\n",
    })
    assert adapter_cross_imports(src) == [
        "waste.adapters.fake.engine: waste.adapters.http.routes",
        "waste.adapters.fake.engine: waste.adapters.http.routes.register",
        "waste.adapters.http.routes: waste.adapters.images",
    ]


def test_the_composition_rule_refuses_adapters_outside_app(tmp_path):
    src = planted(tmp_path, {
        "waste/app/factory.py": "from waste.adapters.fake import FakeEngine\n",
        "waste/tools/eval.py": "from waste.adapters.native import NativeEngine\n",
        "waste/adapters/fake/engine.py": "from waste.adapters.fake.script import FakeScript\n",
        "waste/service/generation.py": "from waste.adapters.fake import FakeEngine\n",
        "waste/domain/ports.py": "import importlib\nimportlib.import_module('waste.adapters.native')\n",
    })
    assert adapter_importers(src) == [
        "waste.domain.ports: waste.adapters.native",
        "waste.service.generation: waste.adapters.fake",
        "waste.service.generation: waste.adapters.fake.FakeEngine",
    ]


def test_the_cycle_rule_finds_direct_indirect_and_lazy_cycles(tmp_path):
    src = planted(tmp_path, {
        "waste/__init__.py": "",
        "waste/a.py": "from waste import b\n",
        "waste/b.py": "from waste.c import thing\n",
        "waste/c.py": "def later():\n    import waste.a\n",
        "waste/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .e import E\n",
        "waste/e.py": "from waste.d import D\n",
        "waste/f.py": "from waste import a, d\n",
        "waste/pkg/__init__.py": "from waste.pkg.leaf import x\n",
        "waste/pkg/leaf.py": "x = 1\n",  # a package importing its own leaf is no cycle
    })
    assert import_cycles(src) == ["waste.a <-> waste.b <-> waste.c", "waste.d <-> waste.e"]


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
                        "waste.domain.chatjson.k2tools.ToolMarkerIds",
                        "waste.domain.chatjson.glmtools.GlmMarkerIds"}


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
