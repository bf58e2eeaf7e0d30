"""The scripted fake engine (docs/HTTP.md §9.1): for tests and client developers.

``script`` parses the SCRIPT, ``vocabulary`` is the fake's tokenizer, ``reply`` renders the
scripted replies in the container's format, and ``engine`` is ``FakeEngine`` (the Engine and
Tokenizer ports) with ``open_fake_engine``, the opener that owns it for a server's lifetime.
"""

from waste.adapters.fake.engine import FakeEngine, FakeRecord, open_fake_engine
from waste.adapters.fake.script import FakeScript, ScriptError, load_script, parse_script

__all__ = ["FakeEngine", "FakeRecord", "FakeScript", "ScriptError", "load_script",
           "open_fake_engine", "parse_script"]
