"""Codex 0.169's ``permissionProfile`` mapped onto a spec exactly, or refused naming what cannot
be mapped (``execgate.sandbox.codex_profile``). The shapes are the ones the real client sends
(captured from ``codex exec`` 0.169 with ``-s read-only``, ``-s workspace-write``, ``--add-dir``,
``sandbox_workspace_write.*``, ``-s danger-full-access``); tests/mcp/test_mcp_codex_cli.py runs
the real client against the real server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execgate.config import SandboxConfig
from execgate.sandbox import OFF, CodexPolicyError, SandboxSpec
from execgate.sandbox.codex_profile import (
    CodexProfileError,
    sandbox_cwd,
    spec_from_permission_profile,
    spec_from_sandbox_state,
)

WORK = "/eg-nowhere/work"  # not on disk: the mapping is pure
EXTRA = "/eg-nowhere/extra"
ENV = {"TMPDIR": "/eg-nowhere/tmpdir"}


def _special(kind: str, access: str) -> dict[str, Any]:
    return {"path": {"type": "special", "value": {"kind": kind}}, "access": access}


def _path(path: str, access: str, skip: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": {"type": "path", "path": path}, "access": access}
    if skip:
        entry["missing_path_behavior"] = "skip"
    return entry


def managed(entries: list[dict[str, Any]], network: str = "restricted") -> dict[str, Any]:
    return {
        "type": "managed",
        "file_system": {"type": "restricted", "entries": entries},
        "network": network,
    }


READ_ONLY = managed([_special("root", "read")])


def workspace_write(*roots: str, tmp: bool = True, network: str = "restricted") -> dict[str, Any]:
    """Exactly what 0.169 sends for ``-s workspace-write`` (``--add-dir`` adds roots)."""
    entries = [_special("root", "read"), *(_path(r, "write") for r in roots)]
    if tmp:
        entries += [_special("slash_tmp", "write"), _special("tmpdir", "write")]
    for name in (".git", ".agents", ".codex", ".aws"):
        entries += [_path(f"{r}/{name}", "read", skip=True) for r in roots]
    return managed(entries, network)


def spec(profile: object, **kw: Any) -> SandboxSpec:
    return spec_from_permission_profile(profile, cwd=Path(WORK), env=ENV, **kw)


def carve_outs(*roots: str) -> set[Path]:
    return {Path(r) / n for r in roots for n in (".git", ".agents", ".codex", ".aws")}


# -- the shapes Codex 0.169 sends ------------------------------------------------------------------


def test_read_only() -> None:
    got = spec(READ_ONLY)
    assert got.mode == "read-only" and not got.network and got.writable_roots == ()


def test_workspace_write_protects_codex_subfolders() -> None:
    got = spec(workspace_write(WORK))
    assert got.mode == "workspace-write"
    assert set(got.writable_roots) == {Path(WORK), Path("/tmp"), Path(ENV["TMPDIR"])}
    assert set(got.readonly_paths) == carve_outs(WORK)
    assert got.protected_names == (".git", ".codex", ".execgate")  # the server's own, too
    assert not got.network
    assert got.allows_write(Path(WORK, "src/a.c")) and not got.allows_write(Path(WORK, ".aws/x"))
    assert not got.allows_write(Path("/eg-nowhere/elsewhere"))


def test_add_dir_roots_and_their_subfolders() -> None:
    got = spec(workspace_write(WORK, EXTRA))
    assert {Path(WORK), Path(EXTRA)} <= set(got.writable_roots)
    assert set(got.readonly_paths) == carve_outs(WORK, EXTRA)


def test_network_enabled_and_tmp_excluded() -> None:
    got = spec(workspace_write(WORK, tmp=False, network="enabled"))
    assert got.network and got.writable_roots == (Path(WORK),)
    assert spec(managed([_special("root", "read")], "enabled")).network


def test_tmpdir_unset_means_no_root() -> None:
    got = spec_from_permission_profile(workspace_write(WORK), cwd=Path(WORK), env={})
    assert set(got.writable_roots) == {Path(WORK), Path("/tmp")}


def test_disabled_and_external_are_off() -> None:
    assert spec({"type": "disabled"}) == OFF
    assert spec({"type": "external", "network": "enabled"}) == OFF


def test_unrestricted_is_everything_writable_then_cut_to_the_bounds() -> None:
    got = spec({"type": "managed", "file_system": {"type": "unrestricted"}, "network": "enabled"})
    assert got.writable_roots == (Path("/"),) and got.network
    bounds = [Path(WORK), Path("/tmp")]
    cut, dropped = got.within(bounds)
    assert cut.writable_roots == tuple(bounds) and dropped == [Path("/")]


def test_other_special_kinds() -> None:
    got = spec(
        managed(
            [
                _special("root", "read"),
                _special("minimal", "read"),
                _special("current_working_directory", "write"),
                {
                    "path": {"type": "special", "value": {"kind": "project_roots", "subpath": "b"}},
                    "access": "read",
                },
                {"path": {"type": "glob_pattern", "pattern": "**/*.md"}, "access": "read"},
            ]
        )
    )
    assert got.writable_roots == (Path(WORK),) and got.readonly_paths == (Path(WORK, "b"),)


def test_none_hides_folders(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    got = spec(
        managed(
            [
                _special("root", "read"),
                _path(str(secret), "none"),
                _path(str(secret / "deeper"), "none"),
                _path("/eg-nowhere/missing", "none"),
            ]
        )
    )
    assert got.mode == "read-only"
    assert got.hidden_paths == (Path("/eg-nowhere/missing"), Path(os.path.realpath(secret)))


def test_carried_from_the_server_config() -> None:
    config = SandboxConfig(strict_exec=True, exec_dirs=["/opt/tools"], writable_git=True)
    got = spec(workspace_write(WORK), config=config)
    assert got.strict_exec and got.exec_dirs == (Path("/opt/tools"),)
    assert ".git" not in got.protected_names
    assert Path(WORK, ".git") in got.readonly_paths  # the client still asks for it


# -- refused, naming what cannot be mapped --------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "named"),
    [
        (managed([_path(WORK, "write")]), "no `:root` read entry"),
        (managed([_special("root", "none")]), "no `:root` read entry"),
        (managed([_special("root", "read"), _special("minimal", "write")]), "`:minimal`"),
        (
            managed(
                [
                    _special("root", "read"),
                    {"path": {"type": "glob_pattern", "pattern": "**/.env"}, "access": "none"},
                ]
            ),
            "glob pattern '**/.env'",
        ),
        (
            managed(
                [
                    _special("root", "read"),
                    {
                        "path": {"type": "special", "value": {"kind": "unknown", "path": ":x"}},
                        "access": "read",
                    },
                ]
            ),
            "unknown special path",
        ),
        (managed([_special("root", "read"), _path(WORK, "execute")]), "unknown access 'execute'"),
        (managed([_special("root", "read"), _path("rel", "write")]), "'rel' is not an absolute"),
        (
            managed(
                [_special("root", "read"), {**_path(WORK, "read"), "missing_path_behavior": "x"}]
            ),
            "missing_path_behavior 'x'",
        ),
        (
            managed(
                [
                    _special("root", "read"),
                    _path(WORK, "write"),
                    _path(f"{WORK}/ro", "read"),
                    _path(f"{WORK}/ro/rw", "write"),
                ]
            ),
            f"{WORK}/ro/rw is writable inside {WORK}/ro, which is read-only",
        ),
        (
            managed(
                [_special("root", "read"), _path(EXTRA, "none"), _path(f"{EXTRA}/in", "write")]
            ),
            "which is hidden",
        ),
        (
            managed(
                [
                    _special("root", "read"),
                    {
                        "path": {
                            "type": "special",
                            "value": {"kind": "project_roots", "subpath": "../up"},
                        },
                        "access": "write",
                    },
                ]
            ),
            "project_roots subpath '../up'",
        ),
        (managed([_special("root", "read")], network="proxied"), "`network`"),
        (
            {"type": "managed", "file_system": {"type": "sideways"}, "network": "restricted"},
            "file_system",
        ),
        ({"type": "Managed"}, "unknown type 'Managed'"),
        ({"type": "external", "network": None}, "`network`"),
        ([], "JSON object"),
    ],
)
def test_refused(profile: object, named: str) -> None:
    with pytest.raises(CodexProfileError) as raised:
        spec(profile)
    assert named in str(raised.value)


def test_hiding_a_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("x")
    with pytest.raises(CodexProfileError, match="is a file"):
        spec(managed([_special("root", "read"), _path(str(secret), "none")]))


# -- the state around it ------------------------------------------------------------------------


def test_sandbox_cwd() -> None:
    assert sandbox_cwd("file:///a%20b/c") == Path("/a b/c")
    assert sandbox_cwd("file://localhost/x/") == Path("/x")
    assert sandbox_cwd("/plain/path") == Path("/plain/path")
    for bad in ("file://host/x", "rel/dir", "file:rel", "", None, 3):
        with pytest.raises(CodexProfileError, match="sandboxCwd"):
            sandbox_cwd(bad)


def test_state_prefers_permission_profile_and_keeps_sandbox_policy(tmp_path: Path) -> None:
    both = {
        "permissionProfile": READ_ONLY,
        "sandboxPolicy": {"type": "danger-full-access"},
        "sandboxCwd": f"file://{tmp_path}",
        "codexLinuxSandboxExe": "/x/codex-linux-sandbox",
        "useLegacyLandlock": False,
    }
    got, field = spec_from_sandbox_state(both, server_cwd=tmp_path, env=ENV)
    assert (got.mode, field) == ("read-only", "permissionProfile")
    legacy = {"sandboxPolicy": {"type": "workspace-write"}, "sandboxCwd": "."}
    got, field = spec_from_sandbox_state(legacy, server_cwd=tmp_path, env={})
    assert field == "sandboxPolicy" and Path(os.path.realpath(tmp_path)) in got.writable_roots
    with pytest.raises(CodexProfileError, match=r"neither .* \(keys: sandboxCwd\)"):
        spec_from_sandbox_state({"sandboxCwd": "/"}, server_cwd=tmp_path)
    with pytest.raises(CodexPolicyError):
        spec_from_sandbox_state(
            {"sandboxPolicy": {"type": "bogus"}, "sandboxCwd": "/"}, server_cwd=tmp_path
        )


def test_within_cuts_roots_to_the_bounds() -> None:
    wish = SandboxSpec(
        mode="workspace-write",
        writable_roots=(Path("/w/sub"), Path("/elsewhere"), Path("/")),
    )
    cut, dropped = wish.within([Path("/w"), Path("/t")])
    assert cut.writable_roots == (Path("/w/sub"), Path("/w"), Path("/t"))
    assert dropped == [Path("/elsewhere"), Path("/")]


# -- exactness: wherever the mapping succeeds, it writes exactly where Codex would -----------------

TREE = ["/", "/eg-h", "/eg-h/a", "/eg-h/a/b", "/eg-h/a/b/c", "/eg-h/d", "/eg-h/d/e"]
ACCESS = ["read", "write", "none"]


def _codex_access(path: str, entries: list[tuple[str, str]]) -> str:
    """Codex's resolution: the most specific entry wins; on a tie none > write > read."""
    rank = {"read": 0, "write": 1, "none": 2}
    matching = [(p, a) for p, a in entries if path == p or path.startswith(p.rstrip("/") + "/")]
    if not matching:
        return "none"
    return max(matching, key=lambda e: (len(Path(e[0]).parts), rank[e[1]]))[1]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(TREE[1:]), st.sampled_from(ACCESS)), max_size=6),
    st.sampled_from(["read", "write"]),
)
def test_mapping_is_exact_or_refused(entries: list[tuple[str, str]], root: str) -> None:
    entries = [("/", root), *entries]
    profile = managed([_path(p, a) if p != "/" else _special("root", a) for p, a in entries])
    try:
        got = spec(profile)
    except CodexProfileError:
        return
    for probe in [*TREE[1:], "/eg-h/a/b/c/f", "/eg-h/d/x"]:
        want = _codex_access(probe, entries)
        hidden = any(Path(probe) == h or h in Path(probe).parents for h in got.hidden_paths)
        assert hidden == (want == "none"), (probe, want)
        if not hidden:
            assert got.allows_write(Path(probe)) == (want == "write"), (probe, want)
