"""The ``execgate`` command line: one module per command group, each with ``register()``."""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import NoReturn

from execgate import __version__
from execgate.cli.parser import ExecgateParser
from execgate.errors import ExecgateError

# Modules under execgate.cli that add commands; each has register(subparsers).
COMMAND_MODULES = ["check", "rules", "run", "sandbox", "mcp", "approvals", "log", "completion"]
# The module of each command (a module named after its command is not listed): a command line
# naming one imports only that module (start-up time: `execgate run` needs none of the others).
COMMAND_MODULE_OF = {"trust": "rules", "untrust": "rules"}

Handler = Callable[[argparse.Namespace], int]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``only``: just that command module's commands (the others
    are not imported)."""
    parser = ExecgateParser(
        prog="execgate",
        description="Gate every program execution by policy.",
        examples=[
            "execgate run -- bash                # a shell whose every exec is gated",
            "execgate rules explain -- git push  # which rule decides, and why",
            "execgate COMMAND --help             # each command's options and examples",
        ],
    )
    parser.add_argument("-V", "--version", action="version", version=f"execgate {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES if only is None else [only]:
        try:
            module = import_module(f"execgate.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"execgate.cli.{name}":
                raise
            continue  # command group not built yet
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Importing the command's modules makes many objects and no garbage: the cyclic collector
    # would only walk them again and again (a tenth of the start-up).
    collecting = gc.isenabled()
    gc.disable()
    try:
        _show_warnings_visibly()
        parser = build_parser(_command_module(sys.argv[1:] if argv is None else argv))
    finally:
        if collecting:
            gc.enable()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    return guarded(lambda: handler(args))


def guarded(work: Callable[[], int]) -> int:
    """``work()``'s exit status; its errors as one line each, never a traceback."""
    try:
        return work()
    except ExecgateError as exc:
        print(f"execgate: error: {exc.message}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # our reader went away (`execgate rules list | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # last resort: a bug, still no traceback unless asked for
        if os.environ.get("EXECGATE_DEBUG"):
            raise
        print(
            f"execgate: internal error: {type(exc).__name__}: {exc} "
            "(set EXECGATE_DEBUG=1 for a traceback)",
            file=sys.stderr,
        )
        return 70


def entry() -> NoReturn:
    """The ``execgate`` commands (:mod:`execgate.console` comes first): :func:`main`, then
    the exit."""
    exit_now(main())


def entry_with(work: Callable[[], int], *, done: Callable[[int], None]) -> NoReturn:
    """Run ``work`` as a command (:func:`guarded`), then exit as :func:`entry` does (the
    server of a native start, execgate/adopt.py), telling ``done`` the status last (unless
    ``work`` already did)."""
    exit_now(guarded(work), done=done)


def exit_now(status: int, *, done: Callable[[int], None] | None = None) -> NoReturn:
    """Once the command is done and only this thread is left, the exit functions run (log
    handlers flush and close), the standard streams are flushed, and the process ends without
    the interpreter's own teardown: with asyncio loaded that reclaims every object one by one
    for tens of milliseconds, which the kernel does at once (`execgate run -- true` is waited
    for until then)."""
    threads = sys.modules.get("threading")
    if threads is not None and threads.active_count() > 1:
        sys.exit(status)  # someone is still at work: the ordinary exit waits for them
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # as the interpreter's own exit: status 120
            status = status or 120
    if done is not None:  # (the native front's server: its front stops waiting here)
        done(status)
    os._exit(status)


def _command_module(argv: Sequence[str]) -> str | None:
    """The module of the command ``argv`` starts with; None (every module) for anything else
    (``execgate --help``, a misspelt command: their messages list every command)."""
    if not argv:
        return None
    name = COMMAND_MODULE_OF.get(argv[0], argv[0])
    return name if name in COMMAND_MODULES else None


def _show_warnings_visibly() -> None:
    """Warnings logged without a configured handler reach the terminal through logging's last
    resort; render them visible there too (they name commands and paths from gated processes)."""
    from execgate.visible import VisibleFormatter

    fallback = logging.StreamHandler(sys.stderr)
    fallback.setLevel(logging.WARNING)
    fallback.setFormatter(VisibleFormatter("%(message)s"))
    logging.lastResort = fallback
