"""The approvals control socket, bound before the first answer (see :mod:`.control`).

A client that has its ``initialize`` answer may at once have someone run ``execgate approvals``:
the server must be listed and reachable by then, even though the rest of it is still starting
(:mod:`.opening`). So the main thread binds the socket and describes the server (``mcp-<pid>
.json``) first; a connection that comes before the server serves it waits in the listen
backlog. :class:`~execgate.mcp_front.control.ControlServer` serves the socket later and
rewrites the description with what only the started server knows.

Light on purpose (no asyncio): this is on the path to the first answer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from typing import Any

from execgate import paths
from execgate.files import ensure_control_dir, write_atomically

log = logging.getLogger("execgate.mcp")

_BACKLOG = 64


class BoundControl:
    """The listening socket (close-on-exec, mode 0600) and the server's description."""

    def __init__(self, info: dict[str, Any]) -> None:
        folder = ensure_control_dir(paths.control_dir())
        pid = os.getpid()
        self.path = folder / f"mcp-{pid}.sock"
        self.descriptor = folder / f"mcp-{pid}.json"
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            self.sock.bind(str(self.path))
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        self.sock.listen(_BACKLOG)
        self.describe(info)

    def announce(self) -> None:
        """Log where the socket is (once the server starts: a start that fails says only why)."""
        if self.path.parent.parent != paths.execgate_home():
            log.warning(
                "%s is not usable; the approvals control socket is %s",
                paths.execgate_home() / "control",
                self.path,
            )
        else:
            log.info("approvals control socket: %s", self.path)

    def describe(self, info: dict[str, Any]) -> None:
        """(Re)write the description ``execgate approvals`` finds the server by."""
        text = json.dumps({"pid": os.getpid(), "socket": str(self.path), **info})
        write_atomically(self.descriptor, (text + "\n").encode("utf-8"))

    def close(self) -> None:
        """Stop listening and remove the socket and the description (idempotent)."""
        self.sock.close()
        for path in (self.descriptor, self.path):
            with contextlib.suppress(OSError):
                path.unlink()
