"""The Python command line: the console script ``execgate-py`` (to which the native ``execgate``
command, native/entry.c, hands every command but a fast ``run``) and ``python -m execgate``.

``execgate run`` goes to the native front (``_bin/execgate-run``, docs/protocol.md §8) before
anything else is imported, unless the front handed it here (``EXECGATE_FRONT_DECLINED``): the
front starts the command from a start-up plan, or hands the command line back. Every other
command, and a declined ``run``, is :func:`execgate.cli.entry`'s. Only ``os`` and ``sys``
here: this module is on the path of ``python -m execgate run``'s fast start.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import NoReturn

#: Set by the native front when it hands a command line back to Python (removed at once, so
#: the command never sees it), to the front's own program: the start-up plan is for it.
FRONT_DECLINED = "EXECGATE_FRONT_DECLINED"
FRONT = "execgate-run"
#: The front that handed this ``run`` back (its program's path), or None: then there is no
#: front to write a start-up plan for (gate/runplan.py).
declined_by: str | None = None


def entry() -> NoReturn:
    native_front()
    from execgate.cli import entry as cli_entry

    cli_entry()


def native_front() -> None:
    """``execgate run``: exec the native front, unless it declined this command line already
    or ``EXECGATE_FAST_START=0``. Returns when the front cannot be started (not built)."""
    global declined_by
    argv = sys.argv[1:]
    front = os.environ.pop(FRONT_DECLINED, None)
    if front is not None:
        declined_by = front if os.path.isabs(front) else None
        return
    if not argv or argv[0] != "run":
        return
    front = os.path.join(os.path.dirname(__file__), "_bin", FRONT)
    if os.environ.get("EXECGATE_FAST_START") == "0":
        declined_by = os.path.realpath(front)  # the next fast start is that front's
        return
    try:
        os.execv(front, [front, sys.executable, *argv[1:]])
    except OSError:
        return
