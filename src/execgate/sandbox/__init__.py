"""Sandbox profiles (read-only, workspace-write, off; strict-exec, network) and kernel support.

Typical use by a front end::

    spec = sandbox_from_args(args, config.sandbox, cwd=cwd, default_mode="workspace-write")
    spec = spec.with_gate_paths(session_dir=session_dir, executables=[wrapper, interposer])
    require_support(spec)                         # ExecgateError naming what is missing
    launcher = await Launcher.start(spec, new_session=True)

See docs/sandbox.md for what each profile enforces and how.
"""

from execgate.sandbox.codex import CodexPolicyError, spec_from_codex_policy
from execgate.sandbox.probe import SandboxSupport, probe, require_support, trial
from execgate.sandbox.spec import (
    OFF,
    PROTECTED_NAMES,
    SYSTEM_EXEC_DIRS,
    SandboxMode,
    SandboxSpec,
    add_sandbox_arguments,
    build_spec,
    existing_carveouts,
    sandbox_from_args,
)

__all__ = [
    "OFF",
    "PROTECTED_NAMES",
    "SYSTEM_EXEC_DIRS",
    "CodexPolicyError",
    "SandboxMode",
    "SandboxSpec",
    "SandboxSupport",
    "add_sandbox_arguments",
    "build_spec",
    "existing_carveouts",
    "probe",
    "require_support",
    "sandbox_from_args",
    "spec_from_codex_policy",
    "trial",
]
