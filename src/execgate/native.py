"""Where the compiled native programs live inside the installed package."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from execgate.errors import ExecgateError

INTERPOSER = "libexecgate.so"
WRAPPER = "execgate-wrapper"
LAUNCHER = "execgate-launch"


def native_path(name: str) -> Path:
    """Absolute path of a native program shipped in the package (``execgate/_bin``)."""
    path = Path(str(importlib.resources.files("execgate") / "_bin" / name)).resolve()
    if not path.exists():
        raise ExecgateError(
            f"execgate's native program {name} is missing at {path}; "
            "reinstall the package (pip install .) so the build compiles native/"
        )
    return path
