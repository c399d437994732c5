"""Check-then-exec races never run a forbidden program (issue 8, item 5).

Small C programs race the gate for real inside `execgate run` (every sandbox mode, as root and
as an unprivileged user), a bounded number of attempts within a few seconds each: a script
swapped for a symlink with renameat2(RENAME_EXCHANGE), a #! line rewritten in place on the
same inode, and posix_spawn while the path is swapped, with a closefrom file action or with
file actions that make every descriptor number a copy of the forbidden program. The
forbidden program is an ELF that proves it ran by creating a file; it must never appear."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SECONDS = "2.5"

MODES = {
    "off": ["--sandbox", "off"],
    "workspace-write": ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir"],
    "strict-exec": [
        "--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir", "--strict-exec",
    ],
}  # fmt: skip


def _gcc(src: Path, out: Path, *defines: str) -> None:
    cmd = ["gcc", "-std=gnu11", "-O1", "-Wall", "-pthread", "-o", str(out), str(src), *defines]
    subprocess.run(cmd, check=True)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)
    os.chown(root, uid, gid)


@pytest.mark.parametrize("race", ["exchange-exec", "rewrite-exec", "exchange-spawn", "dup2-spawn"])
@pytest.mark.parametrize("mode", MODES)
def test_races_never_run_the_forbidden_program(place, mode: str, race: str) -> None:  # type: ignore[no-untyped-def]
    user, base = place
    bin_dir, ws = base / "bin", base / "ws"
    bin_dir.mkdir()
    ws.mkdir()
    ran = ws / "forbidden-ran"
    _gcc(HERE / "c" / "race.c", bin_dir / "race")
    _gcc(HERE / "c" / "forbidden.c", bin_dir / "forbidden", f'-DRAN_FILE="{ran}"')
    shutil.copy2("/bin/true", bin_dir / "good")
    rules = base / "r.rules"
    rules.write_text('prefix_rule(["forbidden"], "forbidden", justification="never")\n')
    race_dir = ws / "r"
    race_dir.mkdir()
    os.symlink(bin_dir / "forbidden", race_dir / "t")
    if race in ("exchange-spawn", "dup2-spawn"):
        os.symlink(bin_dir / "good", race_dir / "s")
    else:
        (race_dir / "s").write_text("#!/bin/sh\nexit 0\n")
        (race_dir / "s").chmod(0o755)
    if race == "rewrite-exec":
        forbidden_line = f"#!{bin_dir / 'forbidden'}\n"
        first = "#!/bin/sh".ljust(len(forbidden_line) - 1) + "\n"
        (race_dir / "s").write_text(first + "exit 0\n")
        (race_dir / "alt").write_text(forbidden_line)
    if user is not None:
        _chown_tree(base, user.uid, user.gid)

    script = f"{bin_dir / 'race'} {race} {race_dir} {SECONDS} 2>/dev/null; echo alive"
    options = [*MODES[mode], *(["--exec-dir", str(bin_dir)] if mode == "strict-exec" else [])]
    cmd = [sys.executable, "-m", "execgate", "run", "--rules", str(rules), *options,
           "--", "bash", "-c", script]  # fmt: skip
    env = {"EXECGATE_HOME": str(base / "home"), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    if user is None:
        r = subprocess.run(cmd, cwd=ws, env={**os.environ, **env}, capture_output=True,
                           timeout=120)  # fmt: skip
    else:
        r = user.run(cmd, cwd=ws, env=env)
    out = r.stdout.decode()
    assert "alive" in out and "attempts=" in out, (out, r.stderr[-2000:])
    attempts = int(out.split("attempts=")[1].split()[0])
    assert attempts >= 20, out  # the race really ran
    assert not ran.exists(), out  # and never won
