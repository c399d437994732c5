"""With the sandbox off, a gated process cannot change which programs need no question: the
snapshot clients read is a sealed memfd of the server (protocol §6), not the session file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .conftest import EXECGATE, Gate

if TYPE_CHECKING:  # the fixture's type (tests/conftest.py)
    from conftest import UnprivilegedUser

# An empty snapshot (no names, no files: "nothing needs a question"), written in pure shell
# over the session file and into the sealed descriptor, then the forbidden program.
ATTACK = r"""
snap=$(dirname "$EXECGATE_SOCKET")/policy.snap
empty() {
    printf 'EGSNAP1\0'; printf '\0%.0s' {1..16}
    printf '@\0\0\0\0\0\0\0@\0\0\0\0\0\0\0'; printf '\0%.0s' {1..24}
}
empty > "$snap.new"; mv -f "$snap.new" "$snap" && echo replaced-file
[ -n "$EXECGATE_SNAPSHOT" ] && echo sealed
empty > "$EXECGATE_SNAPSHOT" 2>/dev/null && echo wrote-sealed
empty 1<> "$EXECGATE_SNAPSHOT" 2>/dev/null && echo overwrote-sealed
touch TARGET; echo rc=$?
echo still-working
"""


def _check(stdout: bytes, target: Path) -> None:
    lines = stdout.decode().splitlines()
    assert "replaced-file" in lines and "sealed" in lines, lines  # the attack was tried
    assert "wrote-sealed" not in lines and "overwrote-sealed" not in lines, lines
    assert "rc=126" in lines and "still-working" in lines, lines
    assert not target.exists()


def test_replaced_snapshot_file_changes_nothing(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["touch"], "forbidden")\n')
    target = gate.root / "touched"
    result = gate.run(ATTACK.replace("TARGET", str(target)))
    assert b"execgate: denied: touch" in result.stderr, result.stderr
    _check(result.stdout, target)


def test_replaced_snapshot_file_changes_nothing_unprivileged(
    unprivileged: UnprivilegedUser,
) -> None:
    folder = unprivileged.make_dir()
    rules = folder / "touch.rules"
    rules.write_text('prefix_rule(["touch"], "forbidden")\n')
    unprivileged.chown_tree(folder)
    target = folder / "touched"
    command = [*EXECGATE, "run", "--rules", str(rules), "--", "bash", "-c"]
    result = unprivileged.run([*command, ATTACK.replace("TARGET", str(target))], cwd=folder)
    assert b"execgate: denied: touch" in result.stderr, result.stderr
    _check(result.stdout, target)
