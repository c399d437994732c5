"""Sandbox profiles (read-only, workspace-write, off; strict-exec, network) and kernel support.

Typical use by a front end::

    spec = sandbox_from_args(args, config.sandbox, cwd=cwd, default_mode="workspace-write")
    spec = spec.with_gate_paths(session_dir=session_dir, executables=[wrapper, interposer])
    require_support(spec)                         # ExecgateError naming what is missing
    launcher = await Launcher.start(spec, new_session=True)

See docs/sandbox.md for what each profile enforces and how.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        sandbox_from_args,
    )

# Imported on first use: a command line that only needs the profiles' flags (`execgate mcp`
# answering `initialize`) does not pay for the kernel probes and Codex's policy translation.
_MODULE_OF = {
    "CodexPolicyError": "codex",
    "spec_from_codex_policy": "codex",
    "SandboxSupport": "probe",
    "probe": "probe",
    "require_support": "probe",
    "trial": "probe",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"execgate.sandbox.{_MODULE_OF.get(name, 'spec')}"), name)
    globals()[name] = value
    return value


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
    "probe",
    "require_support",
    "sandbox_from_args",
    "spec_from_codex_policy",
    "trial",
]
