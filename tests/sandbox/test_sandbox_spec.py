"""SandboxSpec construction (flags, config, Codex policies), kernel support reporting and
refusals, and ``execgate sandbox check``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from execgate.config import SandboxConfig
from execgate.errors import ExecgateError
from execgate.sandbox import (
    OFF,
    CodexPolicyError,
    SandboxSpec,
    SandboxSupport,
    add_sandbox_arguments,
    build_spec,
    probe,
    require_support,
    sandbox_from_args,
    spec_from_codex_policy,
    trial,
)
from execgate.sandbox.spec import path_under

ENV = {"TMPDIR": "/tmp"}


def real(path: str | Path) -> Path:
    return Path(os.path.realpath(path))


# -- build_spec / flags ----------------------------------------------------------------------


def test_workspace_write_roots_are_cwd_extra_tmpdir_and_tmp(tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    spec = build_spec(
        "workspace-write", cwd=tmp_path, writable_roots=["extra"], env={"TMPDIR": str(tmpdir)}
    )
    assert spec.writable_roots == (
        real(tmp_path),
        real(extra),
        real(tmpdir),
        Path("/tmp"),
        Path("/dev/shm"),
    )
    assert spec.protected_names == (".git", ".codex", ".execgate")
    assert not spec.network and not spec.strict_exec
    excluded = build_spec(
        "workspace-write",
        cwd=tmp_path,
        env={"TMPDIR": str(tmpdir)},
        exclude_tmp=True,
        exclude_tmpdir=True,
        writable_git=True,
    )
    assert excluded.writable_roots == (real(tmp_path),)
    assert excluded.protected_names == (".codex", ".execgate")


def test_flags_override_config_and_lists_add_up(tmp_path: Path) -> None:
    configured = tmp_path / "configured"
    configured.mkdir()
    config = SandboxConfig(
        mode="read-only",
        writable_roots=(str(configured),),
        network=True,
        strict_exec=True,
        exec_dirs=("/usr/local/bin",),
    )
    assert build_spec(None, cwd=tmp_path, config=config).mode == "read-only"
    assert build_spec(None, cwd=tmp_path).mode == "off"
    spec = build_spec(
        "workspace-write",
        cwd=tmp_path,
        config=config,
        network=False,
        exec_dirs=["/srv"],
        env=ENV,
    )
    assert spec.mode == "workspace-write" and not spec.network and spec.strict_exec
    assert real(configured) in spec.writable_roots
    assert spec.exec_dirs == (real("/usr/local/bin"), Path("/srv"))


def test_bad_inputs_are_one_sentence_errors(tmp_path: Path) -> None:
    with pytest.raises(ExecgateError, match="unknown sandbox mode"):
        build_spec("full", cwd=tmp_path)
    with pytest.raises(ExecgateError, match="does not exist"):
        build_spec("workspace-write", cwd=tmp_path, writable_roots=["missing"])
    with pytest.raises(ExecgateError, match="only applies to --sandbox workspace-write"):
        build_spec("read-only", cwd=tmp_path, writable_roots=[tmp_path])
    with pytest.raises(ExecgateError, match="only applies with --strict-exec"):
        build_spec("read-only", cwd=tmp_path, exec_dirs=["/srv"])
    with pytest.raises(ExecgateError, match="must be an absolute path"):
        build_spec("workspace-write", cwd=tmp_path, config=SandboxConfig(writable_roots=("rel",)))
    with pytest.raises(ValueError):
        SandboxSpec(mode="workspace-write", writable_roots=(Path("relative"),))


def test_cli_flags(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_sandbox_arguments(parser, default_mode="workspace-write")
    extra = tmp_path / "x"
    extra.mkdir()
    args = parser.parse_args(
        ["--sandbox", "workspace-write", "--writable-root", str(extra), "--network",
         "--strict-exec", "--exec-dir", "/srv", "--exclude-tmp", "--no-exclude-tmpdir",
         "--writable-git"]
    )  # fmt: skip
    spec = sandbox_from_args(args, SandboxConfig(), cwd=tmp_path, env=ENV)
    assert spec.mode == "workspace-write" and spec.network and spec.strict_exec
    assert spec.writable_roots == (real(tmp_path), real(extra), Path("/tmp"))  # $TMPDIR
    assert spec.exec_dirs == (Path("/srv"),) and ".git" not in spec.protected_names
    defaults = sandbox_from_args(parser.parse_args([]), None, cwd=tmp_path, default_mode="off")
    assert defaults == OFF
    assert "workspace-write" in parser.format_help()


def test_launcher_args_translate_the_spec(tmp_path: Path) -> None:
    spec = build_spec(
        "workspace-write", cwd=tmp_path, env=ENV, exclude_tmp=True, network=True,
        strict_exec=True, exec_dirs=["/srv"],
    ).with_gate_paths(session_dir=tmp_path / "s")  # fmt: skip
    root = str(real(tmp_path))
    assert spec.launcher_args() == [
        "--sandbox", "workspace-write", "--writable", root, "--writable", "/tmp",
        "--protect", ".git", "--protect", ".codex", "--protect", ".execgate",
        "--readonly", f"{root}/s", "--network", "--strict-exec", "--exec-dir", "/srv",
    ]  # fmt: skip
    assert OFF.launcher_args() == ["--sandbox", "off"]


def test_allows_write_and_gate_paths(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    spec = build_spec("workspace-write", cwd=tmp_path, env=ENV)
    assert spec.allows_write(tmp_path / "src" / "a.c")
    assert not spec.allows_write(tmp_path / ".git" / "config")
    assert not spec.allows_write(Path("/etc/passwd"))
    assert spec.carve_outs() == [real(tmp_path / ".git")]
    outside = Path("/var/tmp/execgate-session-x")
    assert spec.with_gate_paths(session_dir=outside).readonly_paths == ()
    inside = spec.with_gate_paths(session_dir=tmp_path / "run", executables=[Path("/opt/w")])
    assert inside.readonly_paths == (real(tmp_path / "run"),)
    assert not inside.allows_write(tmp_path / "run" / "gate.sock")
    assert inside.exec_dirs == (Path("/opt/w"),)
    assert not build_spec("read-only", cwd=tmp_path).allows_write(tmp_path)
    assert OFF.allows_write(Path("/etc/passwd"))
    assert "network off" in spec.describe() and OFF.describe().startswith("off")
    root = str(real(tmp_path))
    assert (
        spec.first_writable(["/usr/bin", f"{root}/.git", f"{root}/bin/x", root]) == f"{root}/bin/x"
    )
    assert spec.first_writable(["/usr/bin", f"{root}/.git/hooks"]) is None


def test_path_under_is_lexical_containment() -> None:
    """The fast check says what ``root in path.parents`` says (sibling prefixes are not
    inside, ``/`` holds everything)."""
    paths = ["/", "/a", "/a/b", "/a/bc", "/a/b/c", "/ab", "/a/b/../c", "rel", "rel/x"]
    for path in map(Path, paths):
        for root in map(Path, paths):
            assert path_under(path, root) == (path == root or root in path.parents), (path, root)


def test_allows_write_resolves_each_roots_protected_names(tmp_path: Path) -> None:
    """What a root's protected names and the read-only paths cover, resolved, for the paths
    inside that root (the definition, checked against the spec's faster code)."""
    one, two = tmp_path / "one", tmp_path / "two"
    (two / "repo.git").mkdir(parents=True)
    (one / "sub").mkdir(parents=True)
    (one / ".git").symlink_to(two / "repo.git")
    (two / ".codex").symlink_to(one / "sub")
    spec = build_spec(
        "workspace-write", cwd=one, env=ENV, writable_roots=[str(two)], exclude_tmp=True,
        exclude_tmpdir=True,
    ).with_gate_paths(readonly=[two / "ro"])  # fmt: skip

    def definition(path: Path) -> bool:
        path = real(path)
        roots = [r for r in spec.writable_roots if r == path or r in path.parents]
        covered = [real(p) for p in spec.readonly_paths]
        covered += [real(r / n) for r in roots for n in spec.protected_names]
        return bool(roots) and not any(c == path or c in path.parents for c in covered)

    names = [".git/config", "sub/x", "x", "repo.git/config", ".codex/y", "ro/z", "ro", "../x"]
    checked = [root / name for root in (one, two) for name in names]
    assert [spec.allows_write(p) for p in checked] == [definition(p) for p in checked]
    assert not spec.allows_write(two / "ro" / "z") and spec.allows_write(one / "x")


# -- Codex policies --------------------------------------------------------------------------


def test_codex_policies_map_onto_profiles(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    assert spec_from_codex_policy({"type": "danger-full-access"}, cwd=tmp_path) == OFF
    external = {"type": "external-sandbox", "network_access": "enabled"}
    assert spec_from_codex_policy(external, cwd=tmp_path) == OFF
    read_only = spec_from_codex_policy('{"type": "read-only"}', cwd=tmp_path, env=ENV)
    assert read_only.mode == "read-only" and not read_only.network
    policy = {
        "type": "workspace-write",
        "writable_roots": [str(root)],
        "network_access": True,
        "exclude_tmpdir_env_var": True,
        "exclude_slash_tmp": True,
    }
    ws = spec_from_codex_policy(json.dumps(policy), cwd=tmp_path, env=ENV)
    assert ws.mode == "workspace-write" and ws.network
    assert ws.writable_roots == (real(tmp_path), real(root))
    assert ".git" in ws.protected_names and ".codex" in ws.protected_names
    minimal = spec_from_codex_policy({"type": "workspace-write"}, cwd=tmp_path, env=ENV)
    assert Path("/tmp") in minimal.writable_roots and not minimal.network
    strict = spec_from_codex_policy(
        {"type": "read-only"}, cwd=tmp_path, config=SandboxConfig(strict_exec=True)
    )
    assert strict.strict_exec


@pytest.mark.parametrize(
    "policy",
    [
        {"type": "ReadOnly"},
        {"type": "full"},
        {},
        [],
        "not json",
        {"type": "workspace-write", "writable_roots": ["relative/dir"]},
        {"type": "workspace-write", "network_access": "yes"},
        {"type": "external-sandbox", "network_access": "sometimes"},
    ],
)
def test_codex_policies_codex_rejects_are_rejected(policy: object, tmp_path: Path) -> None:
    with pytest.raises(CodexPolicyError):
        spec_from_codex_policy(policy, cwd=tmp_path)  # type: ignore[arg-type]


# -- kernel support --------------------------------------------------------------------------

NOTHING = SandboxSupport(
    landlock_abi=0,
    landlock_error="Function not implemented",
    seccomp=False,
    seccomp_arch=None,
    seccomp_error="no seccomp filter for this CPU architecture",
    user_namespaces=False,
    mount_namespace=None,
    mount_namespace_error="Operation not permitted",
    bwrap=None,
)


def test_a_kernel_without_support_is_refused_with_what_is_missing_and_how_to_proceed(
    tmp_path: Path,
) -> None:
    (tmp_path / ".git").mkdir()
    spec = build_spec("workspace-write", cwd=tmp_path, env=ENV)
    with pytest.raises(ExecgateError) as info:
        require_support(spec, NOTHING)
    text = str(info.value)
    assert text.startswith("the workspace-write sandbox cannot be enforced on this system")
    assert "Landlock" in text and "seccomp" in text and "mount namespace" in text
    assert "--sandbox off" in text and "bubblewrap" not in text
    old = dataclasses.replace(NOTHING, landlock_abi=2, bwrap="/usr/bin/bwrap")
    text = old.refusal(build_spec("read-only", cwd=tmp_path)) or ""
    assert "Landlock ABI 3 (Linux 6.2), this kernel has ABI 2" in text
    if os.geteuid() == 0:  # root needs the read-only mounts even without carve-outs
        assert "to make the system read-only for root" in text
    else:
        assert "mount namespace" not in text
    assert "bubblewrap (/usr/bin/bwrap)" in text
    require_support(OFF, NOTHING)  # off always works
    assert NOTHING.problems(OFF) == []


def test_a_kernel_without_a_mount_namespace_cannot_give_the_exec_backstop(tmp_path: Path) -> None:
    """Every session covers the programs rules name with stand-ins: without a mount namespace a
    confined session is refused, naming what is missing."""
    no_mounts = dataclasses.replace(
        NOTHING, landlock_abi=7, landlock_error=None, seccomp=True, seccomp_arch="x86_64"
    )
    assert not no_mounts.exec_backstop
    spec = dataclasses.replace(
        build_spec("read-only", cwd=tmp_path), standin_table=tmp_path / "standins.table"
    )
    with pytest.raises(ExecgateError) as info:
        require_support(spec, no_mounts)
    assert "a private mount namespace for the kernel exec backstop" in str(info.value)
    assert "Operation not permitted" in str(info.value)
    assert no_mounts.problems(OFF) == []


def test_probe_reports_this_kernel() -> None:
    support = probe()
    assert support.landlock_abi >= 0
    if support.landlock_abi >= 3:
        assert support.works(SandboxSpec(mode="read-only"))
    if support.mount_namespace is not None:
        assert support.mount_namespace in ("direct", "userns")


def test_trial_applies_a_profile_for_real(tmp_path: Path) -> None:
    support = probe()
    if support.landlock_abi < 3 or not support.seccomp:
        pytest.skip("no sandbox support here")
    assert trial(build_spec("workspace-write", cwd=tmp_path, env=ENV)) is None
    assert trial(OFF) is None


def test_sandbox_check_cli_prints_support_and_profiles() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "execgate", "sandbox", "check"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    out = done.stdout
    support = probe()
    for label in ("kernel:", "Landlock:", "seccomp:", "user namespaces:", "mount namespace:"):
        assert label in out, out
    for profile in ("read-only", "workspace-write", "workspace-write --network", "off"):
        assert f"\n  {profile} " in out, out
    if support.landlock_abi >= 3 and support.seccomp:
        assert f"ABI {support.landlock_abi}" in out
        assert done.returncode == 0, out + done.stderr
        assert out.count(" works") >= 5
    else:
        assert done.returncode == 1


def test_gate_paths_carve_out_only_inside_roots_and_never_a_root(tmp_path: Path) -> None:
    """Read-only carve-outs are kept only where a root would let them be written, never on a
    root itself or above one; hidden folders are passed whatever the roots."""
    (tmp_path / "proj" / ".venv").mkdir(parents=True)
    spec = build_spec("workspace-write", cwd=tmp_path / "proj", env=ENV, exclude_tmp=True)
    guarded = spec.with_gate_paths(
        readonly=[tmp_path / "proj" / ".venv", tmp_path / "proj", tmp_path, Path("/usr")],
        hidden=[tmp_path / "control"],
    )
    assert guarded.readonly_paths == (real(tmp_path / "proj" / ".venv"),)
    assert guarded.hidden_paths == (real(tmp_path / "control"),)
    args = guarded.launcher_args()
    assert args[args.index("--hide") + 1] == str(real(tmp_path / "control"))
    assert not guarded.allows_write(tmp_path / "proj" / ".venv" / "bin" / "python")
    assert guarded.allows_write(tmp_path / "proj" / "src.c")
    assert OFF.with_gate_paths(readonly=[tmp_path], hidden=[tmp_path]) == OFF


def test_within_cuts_roots_to_the_bounds(tmp_path: Path) -> None:
    for name in ("work", "work/sub", "other"):
        (tmp_path / name).mkdir()
    client = build_spec(
        "workspace-write",
        cwd=tmp_path / "work" / "sub",
        writable_roots=[tmp_path / "other", "/"],
        env=ENV,
        exclude_tmp=True,
        exclude_tmpdir=True,
    )
    narrowed, dropped = client.within([real(tmp_path / "work")])
    # `other` goes; `/` holds the bound, so it is cut to it
    assert narrowed.writable_roots == (real(tmp_path / "work" / "sub"), real(tmp_path / "work"))
    assert dropped == [real(tmp_path / "other"), Path("/")]
    assert client.within(client.writable_roots) == (client, [])
