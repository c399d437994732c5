"""The working directory a command runs in, or one sentence when there is none."""

from __future__ import annotations

import os
from pathlib import Path

from execgate.errors import ExecgateError


def working_directory() -> Path:
    """``os.getcwd()``; a working directory that was deleted (or cannot be named) is an
    error the user can act on, not a traceback."""
    try:
        return Path(os.getcwd())
    except FileNotFoundError:
        raise ExecgateError(
            "the working directory no longer exists (it was deleted); cd to one that does"
        ) from None
    except OSError as exc:
        raise ExecgateError(f"cannot tell the working directory: {exc.strerror}") from None
