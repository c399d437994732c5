"""``execgate mcp``: serve the gated ``shell`` tool over MCP (stdio). See docs/mcp.md.

Start-up is on the client's clock: the main thread answers ``initialize`` as soon as it comes
(:mod:`execgate.mcp_front.opening`) while a thread imports the server, reads the configuration
and loads the policy (:func:`_prepare`). Only this module's parser is on the path to the first
answer; everything else is imported by the preparation.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from execgate import __version__
from execgate.cli.options import add_gate_arguments
from execgate.errors import ExecgateError
from execgate.sandbox.spec import add_sandbox_arguments

if TYPE_CHECKING:
    from execgate.mcp_front.server import McpOptions, PolicyState


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="serve a gated `shell` tool to an MCP client (Codex, Claude Code, Cursor, ...)",
        description=(
            "Serve MCP over stdin/stdout with one tool, `shell` (a drop-in for Codex's shell-tool "
            "MCP server): each call runs `bash -lc COMMAND` in its own session, every program it "
            "starts is decided by policy, and prompts are put to the human through the client "
            "(elicitation) or answered with `execgate approvals`. Logs go to stderr."
        ),
        examples=[
            "claude mcp add execgate -- execgate mcp",
            "uvx execgate mcp --sandbox read-only",
            "execgate mcp --elicitation never   # answer with `execgate approvals`",
        ],
    )
    parser.add_argument(
        "-V", "--version", action="version", version=f"execgate {__version__}",
        help="print the version and exit (what an MCP client's config can check)",
    )  # fmt: skip
    parser.add_argument(
        "--shell",
        metavar="PATH",
        help="the shell that runs commands (default: bash from PATH)",
    )
    parser.add_argument(
        "--no-login",
        dest="default_login",
        action="store_false",
        help="when a call does not say `login`, run `bash -c` instead of `bash -lc` "
        "(skips the profile scripts)",
    )
    parser.add_argument(
        "--tools",
        metavar="LIST",
        help="the tools to offer, comma-separated: shell, exec_command, write_stdin (unified "
        "= both of the last two; default: tools in config.toml, else shell)",
    )
    add_gate_arguments(parser, asks="the human")
    parser.add_argument(
        "--elicitation",
        choices=("auto", "always", "never"),
        default="auto",
        help="ask through the client: when it declares elicitation (auto, the default; Codex "
        "clients too), also when it does not (always), or never (only `execgate approvals`)",
    )
    parser.add_argument(
        "--approval-timeout",
        type=float,
        metavar="SECONDS",
        help="deny a prompt nobody answers within this time (default: approval_timeout in "
        "config.toml, else 300)",
    )
    parser.add_argument(
        "--reload-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often to look for changed rules files between calls (default 1; every call "
        "also looks when it starts)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debugging detail")
    parser.add_argument("-q", "--quiet", action="store_true", help="log only warnings and errors")
    parser.add_argument(
        "--workspace",
        metavar="DIR",
        help="the folder calls may write in (workspace-write; default: the server's working "
        "directory); a call's `workdir` outside it and the --writable-root folders runs there "
        "read-only",
    )
    add_sandbox_arguments(parser, default_mode="workspace-write")
    parser.set_defaults(handler=run_mcp)


def _shell(value: str | None) -> str:
    if value is None:
        found = shutil.which("bash") or ("/bin/bash" if os.path.exists("/bin/bash") else None)
        if found is None:
            raise ExecgateError("no bash found on PATH; name a shell with --shell PATH")
        return os.path.abspath(found)
    path = value if "/" in value else shutil.which(value)
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise ExecgateError(f"--shell {value}: not an executable file")
    return os.path.abspath(path)


def _workspace(value: str | None, cwd: Path) -> Path:
    if value is None:
        return Path(os.path.realpath(cwd))
    path = Path(os.path.realpath(cwd / os.path.expanduser(value)))
    if not path.is_dir():
        raise ExecgateError(f"--workspace {value}: not a directory")
    return path


def _configure_logging(args: argparse.Namespace) -> None:
    from execgate.visible import VisibleFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(VisibleFormatter("execgate mcp: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.getLogger("execgate").setLevel(level)
    # One line per escalation goes to the escalations log; on stderr it would flood the
    # client's log (a loop escalates thousands of times): there only with -v, and each tool
    # call's summary line counts them.
    logging.getLogger("execgate.escalations").propagate = bool(args.verbose)


def run_mcp(args: argparse.Namespace) -> int:
    import time

    from execgate.cli.workdir import working_directory
    from execgate.mcp_front.listening import BoundControl
    from execgate.mcp_front.opening import Preparation, answer_opening, claim_stdio

    _configure_logging(args)
    seen = _rules_now(args.rules)  # the rules in force are those of the first answer
    # Listed by `execgate approvals` before the client has its first answer.
    info = {"cwd": str(working_directory()), "started": time.time(), "version": __version__}
    bound = BoundControl(info)
    try:
        stdio = claim_stdio()
        preparation = Preparation(lambda: _prepare(args, seen))
        opening = answer_opening(stdio, preparation.done_fd)
        options, state = preparation.result()  # a bad configuration or policy: its one line
        if opening.eof and not opening.unread.strip():  # the client left after the handshake
            if options.decisions is not None:
                options.decisions.close()
            return 0
        import asyncio
        import gc

        from execgate.mcp_front.server import serve

        # What is loaded by now (modules, the policy) lives as long as the server: out of the
        # cyclic collector's way, so its passes during calls walk only what calls make.
        gc.freeze()
        asyncio.run(serve(options, state, stdio, opening, bound))
    finally:
        bound.close()
    return 0


def _rules_now(rules: list[Path] | None) -> dict[str, os.stat_result | None]:
    """The ``--rules`` files as they are now (the policy is loaded after the first answer)."""
    seen: dict[str, os.stat_result | None] = {}
    for path in rules or ():
        try:
            seen[os.path.abspath(path)] = os.stat(path)
        except OSError:
            seen[os.path.abspath(path)] = None
    return seen


def _prepare(
    args: argparse.Namespace, seen: dict[str, os.stat_result | None]
) -> tuple[McpOptions, PolicyState]:
    """Everything the server needs before its first tool call (run in a thread while the
    opening is answered): configuration, sandbox, decision log, policy."""
    from dataclasses import replace

    from execgate import paths
    from execgate.cli.workdir import working_directory
    from execgate.config import check_tools, load_config
    from execgate.decisionlog import open_front_log
    from execgate.gate import orphans
    from execgate.gate.livepolicy import PolicySource
    from execgate.mcp_front.server import McpOptions, PolicyState
    from execgate.sandbox import build_spec, existing_carveouts, require_support, sandbox_from_args

    orphans.adopt_orphans()  # what a killed launcher leaves behind is ours to kill
    config = load_config()
    cwd = working_directory()
    approval_timeout = (
        args.approval_timeout if args.approval_timeout is not None else config.approval_timeout
    )
    if approval_timeout <= 0:
        raise ExecgateError("--approval-timeout must be positive")
    if args.reload_interval <= 0:
        raise ExecgateError("--reload-interval must be positive")

    workspace = _workspace(args.workspace, cwd)
    source = PolicySource(tuple(args.rules or ()), cwd, config)
    first = source.load()  # PolicyError (one line, file:line:col) stops start-up
    # Fixed here, never by a call: the model picks a call's `workdir`, not what is writable.
    # Network rules in force make the proxy workspace-write's default network mode.
    sandbox = sandbox_from_args(
        args,
        config.sandbox,
        cwd=workspace,
        default_mode="workspace-write",
        network_rules=bool(first.policy.network_rules),
    )
    bounds = build_spec(
        "workspace-write",
        cwd=workspace,
        config=config.sandbox,
        writable_roots=args.sandbox_writable_roots,
        exclude_tmp=args.sandbox_exclude_tmp,
        exclude_tmpdir=args.sandbox_exclude_tmpdir,
    ).writable_roots
    # Every call is a session of its own, whose sandbox sees the `.git` an earlier call made
    # read-only: only those there now are trusted at a claim (native/gitrepo.h).
    known = existing_carveouts((*bounds, *sandbox.writable_roots), sandbox.protected_names)
    sandbox = replace(sandbox, known_carveouts=known)
    require_support(sandbox)  # a profile this kernel cannot enforce: say so now
    decisions = open_front_log("mcp", config, audit=args.audit)
    moved = paths.log_dir_moved()
    if moved:
        logging.getLogger("execgate.mcp").warning("%s", moved)
    options = McpOptions(
        shell=_shell(args.shell),
        sandbox=sandbox,
        writable_bounds=bounds,
        config=config,
        approval_timeout=approval_timeout,
        rules=args.rules,
        default_login=args.default_login,
        audit=args.audit,
        decisions=decisions,
        on_prompt_deny=args.on_prompt == "deny",
        elicitation=args.elicitation,
        reload_interval=args.reload_interval,
        cwd=cwd,
        tools=config.tools
        if args.tools is None
        else check_tools(tuple(n.strip() for n in args.tools.split(",") if n.strip()), "--tools"),
    )
    return options, PolicyState(options, source, first, seen)
