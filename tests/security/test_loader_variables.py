"""Issue 8 item 4 (loader variables): ``LD_AUDIT`` and ``GLIBC_TUNABLES`` cannot remove the
interposer. A ten-line audit library whose ``la_objsearch`` refuses every object named
``libexecgate`` is built here; a gated command then starts ``bash`` with it (through the
environment and through the loader's ``--audit`` option) and that bash execs the forbidden
marker. The caller's loader values are replaced by the ones the gated process was loaded with,
so the marker is denied in every mode, and the session goes on.
"""

from __future__ import annotations

import subprocess

import pytest

from .conftest import MODES, Attacker

AUDIT_C = r"""
#define _GNU_SOURCE
#include <link.h>
#include <string.h>
unsigned int la_version(unsigned int v) { return LAV_CURRENT; }
char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag) {
    return strstr(name, "libexecgate") ? NULL : (char *)name;
}
"""


def build_audit_library(a: Attacker) -> str:
    source = a.work / "skip.c"
    source.write_text(AUDIT_C)
    library = a.work / "skip.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", library, source], check=True)
    a.give(a.work)
    return str(library)


@pytest.mark.parametrize("mode", MODES)
def test_ld_audit_cannot_unload_the_gate(attacker: Attacker, mode: str) -> None:
    library = build_audit_library(attacker)
    result = attacker.run(
        f"LD_AUDIT={library} bash -c 'marker; echo inner-bash-done'\n"
        f"env LD_AUDIT={library} bash -c marker\n"
        f"GLIBC_TUNABLES=glibc.rtld.nns=1 LD_AUDIT={library} bash -c marker\n"
        "echo session-still-works\n",
        mode=mode,
    )
    assert not attacker.ran(), result.stderr
    assert b"inner-bash-done" in result.stdout, result.stderr
    assert b"session-still-works" in result.stdout, result.stderr
    assert result.stderr.count(b"marker must not run") == 3, result.stderr


@pytest.mark.parametrize("mode", MODES)
def test_the_loaders_audit_option_is_refused(attacker: Attacker, mode: str) -> None:
    library = build_audit_library(attacker)
    result = attacker.run(
        f"/lib64/ld-linux-x86-64.so.2 --audit {library} /bin/bash -c marker\n"
        "echo session-still-works\n",
        mode=mode,
    )
    assert not attacker.ran(), result.stderr
    assert b"session-still-works" in result.stdout, result.stderr
    assert b"audit library" in result.stderr, result.stderr
