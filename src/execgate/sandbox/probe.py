"""What this kernel supports, asked of ``execgate-launch --probe`` (the same C code that
enforces the sandbox, so the answer is the truth, not a guess)."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from execgate.errors import ExecgateError
from execgate.native import LAUNCHER, native_path
from execgate.sandbox.spec import SandboxSpec

#: Landlock ABI the confined profiles need (TRUNCATE rights; Linux 6.2).
MIN_LANDLOCK_ABI = 3
#: TCP bind/connect rules (Linux 6.7); below it only seccomp keeps the network off.
LANDLOCK_NET_ABI = 4
#: Device ioctl rights (Linux 6.10).
LANDLOCK_IOCTL_ABI = 5
#: Signal and abstract-Unix-socket scoping (Linux 6.12).
LANDLOCK_SCOPE_ABI = 6


@dataclass(frozen=True, slots=True)
class SandboxSupport:
    landlock_abi: int  # 0: no Landlock
    landlock_error: str | None
    seccomp: bool
    seccomp_arch: str | None  # None: no filter for this CPU architecture
    seccomp_error: str | None
    user_namespaces: bool
    mount_namespace: str | None  # "direct" (privileged), "userns", or None
    mount_namespace_error: str | None
    bwrap: str | None  # bubblewrap's path, if installed

    def problems(self, spec: SandboxSpec) -> list[str]:
        """What ``spec`` needs that this kernel lacks, one phrase each (empty: it works)."""
        if not spec.confines:
            return []
        missing = []
        if self.landlock_abi == 0:
            why = self.landlock_error or "not available"
            missing.append(
                f"Landlock ({why}; it needs Linux >= 6.2 built with CONFIG_SECURITY_LANDLOCK "
                "and `landlock` in the lsm= boot parameter)"
            )
        elif self.landlock_abi < MIN_LANDLOCK_ABI:
            missing.append(
                f"Landlock ABI {MIN_LANDLOCK_ABI} (Linux 6.2), this kernel has ABI "
                f"{self.landlock_abi}"
            )
        if not self.seccomp:
            missing.append(f"seccomp filters ({self.seccomp_error or 'not available'})")
        if self.mount_namespace is None:
            why = self.mount_namespace_error or "not available"
            carve_outs = spec.carve_outs()
            if spec.standin_table is not None:  # every session's: named first
                missing.append(
                    f"a private mount namespace for the kernel exec backstop (stand-ins over "
                    f"the programs rules name; {why}; unprivileged user namespaces are off here)"
                )
            elif carve_outs:
                names = ", ".join(str(p) for p in carve_outs)
                missing.append(
                    f"a private mount namespace to keep {names} read-only ({why}; "
                    "unprivileged user namespaces are off here; --writable-git lifts the "
                    ".git part)"
                )
            elif os.geteuid() == 0:
                missing.append(
                    f"a private mount namespace to make the system read-only for root ({why}; "
                    "Landlock alone does not stop chmod, chown or utimes)"
                )
            elif spec.hidden_paths:
                missing.append(
                    f"a private mount namespace to hide execgate's control sockets ({why}; "
                    "unprivileged user namespaces are off here)"
                )
        return missing

    @property
    def exec_backstop(self) -> bool:
        """Whether the kernel enforces the policy on execs the interposer does not see: the
        stand-ins need a mount namespace, the ptrace/memfd rules seccomp."""
        return self.mount_namespace is not None and self.seccomp

    @property
    def metadata_protected(self) -> bool:
        """Whether chmod/chown/utimes/xattr outside the writable roots are stopped (read-only
        mounts); without a mount namespace only Landlock applies, which does not cover them."""
        return self.mount_namespace is not None

    def works(self, spec: SandboxSpec) -> bool:
        return not self.problems(spec)

    def refusal(self, spec: SandboxSpec) -> str | None:
        """The sentence refusing ``spec``, or None if it can be enforced."""
        missing = self.problems(spec)
        if not missing:
            return None
        text = (
            f"the {spec.mode} sandbox cannot be enforced on this system: it needs "
            f"{'; and '.join(missing)}. Run with --sandbox off to go without confinement "
            "(the gate still decides every exec)"
        )
        if self.bwrap:
            text += (
                f", or confine execgate from outside with bubblewrap ({self.bwrap}), e.g. "
                '`bwrap --ro-bind / / --dev /dev --proc /proc --bind "$PWD" "$PWD" '
                "--bind /tmp /tmp --unshare-net -- execgate … --sandbox off`"
            )
        return text + "."


def _parse(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def _run_probe(args: list[str]) -> dict[str, str]:
    launcher = native_path(LAUNCHER)
    try:
        result = subprocess.run(
            [str(launcher), "--probe", *args],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExecgateError(f"cannot probe sandbox support with {launcher}: {exc}") from None
    if result.returncode != 0:
        raise ExecgateError(
            f"{launcher} --probe failed (status {result.returncode}): {result.stderr.strip()}"
        )
    return _parse(result.stdout)


@functools.cache
def probe() -> SandboxSupport:
    """This system's sandbox support (probed once per process)."""
    v = _run_probe([])
    arch = v.get("seccomp_arch")
    mount = v.get("mount_namespace")
    return SandboxSupport(
        landlock_abi=int(v.get("landlock_abi", "0") or 0),
        landlock_error=v.get("landlock_error"),
        seccomp=v.get("seccomp") == "1",
        seccomp_arch=None if arch in (None, "unsupported") else arch,
        seccomp_error=v.get("seccomp_error"),
        user_namespaces=v.get("user_namespaces") == "1",
        mount_namespace=mount if mount in ("direct", "userns") else None,
        mount_namespace_error=v.get("mount_namespace_error"),
        bwrap=shutil.which("bwrap"),
    )


def require_support(spec: SandboxSpec, support: SandboxSupport | None = None) -> None:
    """Raise :class:`ExecgateError` naming what is missing if ``spec`` cannot be enforced."""
    if not spec.confines:
        return
    refusal = (support or probe()).refusal(spec)
    if refusal:
        raise ExecgateError(refusal)


def trial(spec: SandboxSpec) -> str | None:
    """Apply ``spec`` for real in a throwaway child of the launcher: None if that worked,
    else the launcher's error message. For workspace-write, a scratch writable root holding
    a ``.git`` is added, so the mount-namespace path is exercised too; a spec with a stand-in
    table gets a scratch one (a stand-in mounted over a scratch program)."""
    if not spec.confines:
        return None
    with tempfile.TemporaryDirectory(prefix="execgate-trial-") as scratch:
        if spec.mode == "workspace-write":
            os.mkdir(os.path.join(scratch, ".git"), 0o700)
            root = Path(os.path.realpath(scratch))
            spec = dataclasses.replace(
                spec,
                writable_roots=(*spec.writable_roots, root),
                protected_names=tuple(dict.fromkeys((*spec.protected_names, ".git"))),
                hidden_paths=(),
            )
        if spec.standin_table is not None:
            base = Path(os.path.realpath(scratch))
            for name in ("program", "standin"):
                (base / name).write_bytes(b"#!/bin/sh\n")
                (base / name).chmod(0o755)
            table = base / "standins.table"
            table.write_bytes(b"%s\0%s\0" % (bytes(base / "standin"), bytes(base / "program")))
            spec = dataclasses.replace(spec, standin_table=table)
        values = _run_probe(spec.launcher_args())
    if values.get("trial") == "ok":
        return None
    return values.get("trial_error", "the trial gave no answer")
