"""~/.execgate/config.toml: typed settings; every mistake is one sentence naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from execgate.config import Config, SandboxConfig, load_config
from execgate.errors import ExecgateError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_absent_file_means_defaults(tmp_path: Path) -> None:
    assert load_config(tmp_path / "missing.toml") == Config()


def test_every_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "import_codex_rules = false\ngate_escalated = false\napproval_timeout = 12.5\n"
        'clean_escalated_env = ["MY_PLUGIN_PATH", "ACME_*"]\n'
        '[sandbox]\nmode = "read-only"\nwritable_roots = ["/a"]\nnetwork = true\n'
        'strict_exec = true\nexec_dirs = ["/opt/x"]\nexclude_tmp = true\n'
        "exclude_tmpdir = true\nwritable_git = true\n",
    )
    assert load_config(path) == Config(
        path=path,
        import_codex_rules=False,
        gate_escalated=False,
        approval_timeout=12.5,
        clean_escalated_env=("MY_PLUGIN_PATH", "ACME_*"),
        sandbox=SandboxConfig(
            mode="read-only",
            writable_roots=("/a",),
            network=True,
            strict_exec=True,
            exec_dirs=("/opt/x",),
            exclude_tmp=True,
            exclude_tmpdir=True,
            writable_git=True,
        ),
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus = 1\n", "unknown key `bogus`"),
        ("[sandbox]\nbogus = 1\n", "unknown key `sandbox.bogus`"),
        ("import_codex_rules = 1\n", "`import_codex_rules` must be a boolean, got 1"),
        ('approval_timeout = "x"\n', "`approval_timeout` must be an integer or number, got 'x'"),
        ("approval_timeout = true\n", "`approval_timeout` must be an integer or number"),
        ("approval_timeout = 0\n", "`approval_timeout` must be positive"),
        ("sandbox = 3\n", "`sandbox` must be a table, got 3"),
        ('[sandbox]\nmode = "strict"\n', "`sandbox.mode` must be one of read-only, workspace"),
        ("[sandbox]\nwritable_roots = [1]\n", "`sandbox.writable_roots[0]` must be a string"),
        ('clean_escalated_env = ["A=B"]\n', "`clean_escalated_env[0]` must be a variable name"),
        ('clean_escalated_env = ["*"]\n', "`clean_escalated_env[0]` must be a variable name"),
        ("[sandbox\n", "invalid TOML: Expected ']' at the end of a table declaration (at line 1"),
    ],
)
def test_mistakes_are_one_sentence_naming_file_and_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ExecgateError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
