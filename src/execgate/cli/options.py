"""Options shared by the front ends that gate (``execgate run``, ``execgate mcp``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_gate_arguments(parser: argparse.ArgumentParser, *, asks: str) -> None:
    """``--rules``, ``--on-prompt`` and ``--audit``. ``asks``: who a prompt goes to."""
    parser.add_argument(
        "--rules",
        "-r",
        action="append",
        type=Path,
        metavar="FILE",
        help="use exactly these rules files instead of the layered policy (repeatable)",
    )
    parser.add_argument(
        "--on-prompt",
        choices=("ask", "deny"),
        default="ask",
        help=f"what to do when policy says prompt (default: ask {asks})",
    )
    parser.add_argument(
        "--audit",
        type=Path,
        metavar="FILE",
        help="append every exec decision (and every human answer) to FILE as JSON lines; "
        "every exec then asks the server",
    )
