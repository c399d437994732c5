"""Build hook: compile the native programs in ``native/`` into the package (``execgate/_bin``).

The C code is not a Python extension; a placeholder ``Extension`` only tells setuptools that
the distribution is platform-specific and that ``build_ext`` must run (also for editable
installs, where ``inplace`` puts the binaries into ``src/execgate/_bin``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent


def _native_build():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("execgate_native_build", HERE / "native/build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildNative(build_ext):
    def run(self) -> None:
        if self.inplace:
            out = HERE / "src/execgate/_bin"
        else:
            out = Path(self.build_lib) / "execgate/_bin"
        self._outputs = [str(p) for p in _native_build().build(out, force=not self.inplace)]

    def get_outputs(self) -> list[str]:
        return list(getattr(self, "_outputs", []))


class PlatformWheel(bdist_wheel):  # type: ignore[misc]
    """Tag the wheel ``py3-none-<platform>``: it holds programs for this platform and pure
    Python for any Python 3, and no module built against a Python ABI."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    ext_modules=[Extension("execgate._bin.placeholder", sources=[])],
    cmdclass={"build_ext": BuildNative, "bdist_wheel": PlatformWheel},
)
