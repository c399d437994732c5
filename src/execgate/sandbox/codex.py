"""Codex's ``SandboxPolicy`` JSON (``codex/sandbox-state/update``) mapped onto a spec.

Shapes (tag ``type``, kebab-case; docs/reference codex-compat §3.10)::

    {"type": "danger-full-access"}
    {"type": "read-only"}                               (0.97 also sent network_access, access)
    {"type": "workspace-write", "writable_roots": ["/abs", …], "network_access": false,
     "exclude_tmpdir_env_var": false, "exclude_slash_tmp": false}   (every field optional)
    {"type": "external-sandbox", "network_access": "enabled" | "restricted"}

Unknown types, PascalCase tags and relative writable roots are errors, as in Codex; unknown
extra fields are ignored (serde's default).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from execgate.config import SandboxConfig
from execgate.errors import ExecgateError
from execgate.sandbox.spec import OFF, SandboxSpec, build_spec

POLICY_TYPES = ("danger-full-access", "read-only", "workspace-write", "external-sandbox")


class CodexPolicyError(ExecgateError):
    """A ``SandboxPolicy`` that Codex itself would fail to deserialize."""


def _bool(policy: Mapping[str, Any], key: str) -> bool:
    value = policy.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise CodexPolicyError(f"sandbox policy: `{key}` must be a boolean, got {value!r}")
    return value


def spec_from_codex_policy(
    policy: Mapping[str, Any] | str | bytes,
    *,
    cwd: Path,
    config: SandboxConfig | None = None,
    env: Mapping[str, str] | None = None,
) -> SandboxSpec:
    """The spec for a Codex ``SandboxPolicy`` (a parsed JSON object or its text) in ``cwd``
    (Codex's ``sandboxCwd``). ``config`` contributes what the policy cannot say:
    ``strict_exec``/``exec_dirs`` and ``writable_git``."""
    if isinstance(policy, str | bytes):
        try:
            policy = json.loads(policy)
        except ValueError as exc:
            raise CodexPolicyError(f"sandbox policy is not JSON: {exc}") from None
    if not isinstance(policy, Mapping):
        raise CodexPolicyError("sandbox policy must be a JSON object")
    kind = policy.get("type")
    if kind not in POLICY_TYPES:
        raise CodexPolicyError(
            f"unknown sandbox policy type {kind!r} (expected one of {', '.join(POLICY_TYPES)})"
        )
    config = config or SandboxConfig()
    if kind == "danger-full-access":
        return OFF
    if kind == "external-sandbox":
        access = policy.get("network_access", "restricted")
        if access not in ("enabled", "restricted"):
            raise CodexPolicyError(
                f'sandbox policy: `network_access` must be "enabled" or "restricted", '
                f"got {access!r}"
            )
        return OFF  # confinement is the outer sandbox's job
    carried = SandboxConfig(
        strict_exec=config.strict_exec,
        exec_dirs=config.exec_dirs,
        writable_git=config.writable_git,
    )
    if kind == "read-only":
        return build_spec(
            "read-only", cwd=cwd, config=carried, env=env, network=_bool(policy, "network_access")
        )
    roots = policy.get("writable_roots", [])
    if roots is None:
        roots = []
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        raise CodexPolicyError("sandbox policy: `writable_roots` must be a list of paths")
    for root in roots:
        if not Path(root).is_absolute():
            raise CodexPolicyError(f"sandbox policy: writable root {root!r} is not absolute")
    return build_spec(
        "workspace-write",
        writable_roots=roots,
        network=_bool(policy, "network_access"),
        exclude_tmpdir=_bool(policy, "exclude_tmpdir_env_var"),
        exclude_tmp=_bool(policy, "exclude_slash_tmp"),
        cwd=cwd,
        config=carried,
        env=env,
    )
