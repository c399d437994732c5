"""The argument parser every ``execgate`` command and subcommand is built with: help text
wrapped as usual, except the ``examples:`` block, which keeps its lines."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

EXAMPLES_HEADING = "examples:"


class ExamplesFormatter(argparse.HelpFormatter):
    """argparse's formatter; the examples block is printed as written (one command a line)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(EXAMPLES_HEADING):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class ExecgateParser(argparse.ArgumentParser):
    """``examples=["execgate rules list", ...]`` becomes the help's last block. Subcommand
    parsers (``add_subparsers().add_parser``) are of this class too."""

    def __init__(self, *args: Any, examples: Sequence[str] = (), **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", ExamplesFormatter)
        if examples:
            kwargs["epilog"] = EXAMPLES_HEADING + "".join(f"\n  {line}" for line in examples)
        super().__init__(*args, **kwargs)
