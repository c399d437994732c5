"""``execgate sandbox check``: what this kernel supports and which profiles will work."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
from pathlib import Path
from typing import Any

from execgate.cli.workdir import working_directory
from execgate.sandbox import SandboxSpec, SandboxSupport, build_spec, probe, trial
from execgate.sandbox.probe import (
    LANDLOCK_IOCTL_ABI,
    LANDLOCK_NET_ABI,
    LANDLOCK_SCOPE_ABI,
    MIN_LANDLOCK_ABI,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sandbox",
        help="inspect sandbox support",
        description="Inspect what this kernel supports for execgate's sandbox profiles.",
        examples=["execgate sandbox check", "execgate sandbox check --json"],
    )
    commands = parser.add_subparsers(dest="sandbox_command", metavar="COMMAND")
    check = commands.add_parser(
        "check",
        help="print what this kernel supports and which sandbox profiles will work",
        description="Print the Landlock ABI, seccomp, user and mount namespace support, and "
        "try each sandbox profile for real in a throwaway process. Exit status 0 when every "
        "profile works, 1 otherwise.",
        examples=["execgate sandbox check", "execgate sandbox check --json | jq .profiles"],
    )
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(handler=run_check)
    parser.set_defaults(handler=lambda args: _help(parser))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _landlock_line(s: SandboxSupport) -> str:
    if s.landlock_abi == 0:
        return f"no ({s.landlock_error or 'not available'})"
    features = [
        ("filesystem", s.landlock_abi >= MIN_LANDLOCK_ABI),
        ("TCP bind/connect", s.landlock_abi >= LANDLOCK_NET_ABI),
        ("device ioctls", s.landlock_abi >= LANDLOCK_IOCTL_ABI),
        ("signal & abstract socket scoping", s.landlock_abi >= LANDLOCK_SCOPE_ABI),
    ]
    listed = ", ".join(f"{name} {_yes(ok)}" for name, ok in features)
    return f"ABI {s.landlock_abi} ({listed})"


def _profiles(cwd: Path) -> list[tuple[str, SandboxSpec]]:
    env = dict(os.environ)
    return [
        ("read-only", build_spec("read-only", cwd=cwd, env=env)),
        ("workspace-write", build_spec("workspace-write", cwd=cwd, env=env)),
        ("workspace-write --network", build_spec("workspace-write", cwd=cwd, network=True)),
        ("read-only --strict-exec", build_spec("read-only", cwd=cwd, strict_exec=True)),
    ]


def run_check(args: argparse.Namespace) -> int:
    cwd = working_directory()
    support = probe()
    uname = platform.uname()
    profiles: list[tuple[str, str]] = []
    for label, spec in _profiles(cwd):
        # Sessions always cover the programs rules name (the trial mounts a scratch stand-in).
        spec = dataclasses.replace(spec, standin_table=Path("/"))
        refusal = support.problems(spec)
        if refusal:
            verdict = "unavailable: needs " + "; ".join(refusal)
        else:
            error = trial(spec)
            verdict = "works" if error is None else f"fails: {error}"
        profiles.append((label, verdict))
    all_ok = all(verdict == "works" for _, verdict in profiles)
    if args.json:
        report = {
            "kernel": f"{uname.system} {uname.release} {uname.machine}",
            "landlock_abi": support.landlock_abi,
            "landlock_error": support.landlock_error,
            "seccomp": support.seccomp,
            "seccomp_arch": support.seccomp_arch,
            "seccomp_error": support.seccomp_error,
            "user_namespaces": support.user_namespaces,
            "mount_namespace": support.mount_namespace,
            "mount_namespace_error": support.mount_namespace_error,
            "metadata_protected": support.metadata_protected,
            "exec_backstop": support.exec_backstop,
            "bubblewrap": support.bwrap,
            "profiles": {label: verdict for label, verdict in profiles},
            "all_profiles_work": all_ok,
        }
        print(json.dumps(report, indent=2))
        return 0 if all_ok else 1
    print(f"kernel:            {uname.system} {uname.release} {uname.machine}")
    print(f"Landlock:          {_landlock_line(support)}")
    if support.seccomp:
        seccomp = f"yes (filter for {support.seccomp_arch})"
    else:
        seccomp = f"no ({support.seccomp_error or 'not available'})"
    print(f"seccomp:           {seccomp}")
    print(f"user namespaces:   {_yes(support.user_namespaces)}")
    if support.mount_namespace == "direct":
        mount = "yes (privileged)"
    elif support.mount_namespace == "userns":
        mount = "yes (inside a user namespace)"
    else:
        mount = f"no ({support.mount_namespace_error or 'not available'})"
    print(f"mount namespace:   {mount}")
    if support.metadata_protected:
        print("                   (outside the writable roots everything is mounted read-only:")
        print("                   no chmod/chown/utimes/xattr; .git & co. stay read-only)")
    else:
        print("                   (without it: no .git protection; chmod/utimes/xattr on your")
        print("                   own files outside the writable roots are not prevented)")
    if support.exec_backstop:
        backstop = "active (every program a rule names is covered by a stand-in that asks"
        backstop += (
            "\n                   the server; ptrace denied; strict-exec: no exec of memfds)"
        )
    else:
        backstop = "unavailable: it needs a private mount namespace and seccomp; confined"
        backstop += "\n                   profiles are refused"
    print(f"exec backstop:     {backstop}")
    print(f"bubblewrap:        {support.bwrap or 'not installed'}")
    print()
    print("profiles:")
    for label, verdict in profiles:
        print(f"  {label:<27} {verdict}")
    print(f"  {'off':<27} works (no confinement; the gate still decides every exec)")
    if support.landlock_abi and support.landlock_abi < LANDLOCK_NET_ABI:
        print()
        print(
            "note: without Landlock ABI 4 the network is kept off by the seccomp filter alone "
            "(socket() for AF_UNIX only)."
        )
    return 0 if all_ok else 1
