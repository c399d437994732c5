"""Errors meant for the person running execgate: one clear sentence, never a traceback."""

from __future__ import annotations


class ExecgateError(Exception):
    """A failure to report as ``execgate: error: <message>`` with exit status 1.

    ``message`` must say what is wrong (and where: file:line:col for input files) in one
    sentence; the CLI prints it as is.
    """

    def __init__(self, message: str, *, exit_status: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_status = exit_status

    def __str__(self) -> str:
        return self.message
