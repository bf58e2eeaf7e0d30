"""Builds libwaste (make -C native) and the cffi extension that links it; see pyproject.toml."""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_ext import build_ext


class BuildWithLibwaste(build_ext):
    """Runs the native Makefile first: the extension links its static, -fPIC libwaste.a."""

    def run(self):
        subprocess.run(["make", "-C", "native", f"-j{os.cpu_count() or 1}", "build/libwaste.a"],
                       check=True)
        super().run()


setup(cffi_modules=["src/waste/adapters/native/_build.py:ffibuilder"],
      cmdclass={"build_ext": BuildWithLibwaste})
