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

# setuptools has no build_scripts of its own: distutils' (setuptools' copy, imported above)
from distutils.command.build_scripts import build_scripts  # noqa: E402

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


class BuildEntry(build_scripts):
    """The ``execgate`` command is a native program (native/entry.c, docs/protocol.md §8),
    installed as the distribution's one script, beside the console script ``execgate-py``:
    by ``pip install`` (also ``--user``, pipx) and ``pip install -e`` alike. ``scripts``
    below names its source only so that the scripts are built and installed at all."""

    def run(self) -> None:
        entry = _native_build().build_entry(Path(self.build_dir), force=True)
        self._outputs = [str(entry)]

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
    scripts=["native/entry.c"],
    cmdclass={"build_ext": BuildNative, "build_scripts": BuildEntry, "bdist_wheel": PlatformWheel},
)
