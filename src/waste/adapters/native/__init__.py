"""libwaste through cffi (API mode): ``NativeEngine`` implements the Engine port.

Importing this package needs the compiled extension ``_libwaste``; ``pip install -e .``
builds it (setup.py runs ``make -C native`` and links ``native/build/libwaste.a``).
"""

from waste.adapters.native.context import (MemoryPlan, check_api_version, library_build_info,
                                           library_version, library_versions, plan_memory)
from waste.adapters.native.engine import (NativeEngine, NativeGenerationResult, NativeTokenizer,
                                          open_native, open_native_engine)
from waste.adapters.native.options import NativeOptions

__all__ = ["NativeEngine", "NativeGenerationResult", "NativeTokenizer", "NativeOptions", "MemoryPlan", "open_native",
           "open_native_engine",
           "plan_memory", "library_version", "library_versions", "library_build_info",
           "check_api_version"]
