"""Compile execgate's native programs (the exec interposer, the exec wrapper, the launcher).

Used by the package build (``setup.py``) and runnable on its own while developing::

    python native/build.py src/execgate/_bin

Plain ``cc`` invocations rather than setuptools ``Extension``s: none of these is a Python
module, and the interposer must not link anything but libc (every gated exec loads it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

NATIVE = Path(__file__).resolve().parent

# The native front of `execgate run` (docs/protocol.md §8): the interposer's snapshot check, the
# decision log's chain.
FRONT = ["front.c", "chain.c", "sha256.c", "gate.c", "claim.c", "tree.c", "common.c"]

# target -> (sources, extra flags). Headers in native/ are dependencies of every target.
TARGETS: dict[str, tuple[list[str], list[str]]] = {
    # loaded by every program a gated process starts: bound lazily (no -z now: the exec path
    # calls nothing outside the library, see strings.c and sys.h), two segments
    "libexecgate.so": (
        ["interpose.c", "hold.c", "spawn.c", "gate.c", "claim.c", "common.c", "strings.c"],
        ["-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-z,noseparate-code"],
    ),
    # static: no dynamic loader and no preloaded interposer in the wrapper itself, which every
    # escalation and every patched-shell exec starts
    "execgate-wrapper": (["wrapper.c", "gate.c", "claim.c", "common.c"], ["-static"]),
    "execgate-launch": (
        ["launch.c", "gitrepo.c", "sandbox.c", "netns.c", "tree.c", "common.c"],
        [],
    ),
    # the native front for `python -m execgate run`
    "execgate-run": (["run_main.c", *FRONT], []),
}

#: The installed ``execgate`` command (native/entry.c): the front for ``execgate run``, the
#: console script ``execgate-py`` for everything else. Built by setup.py's build_scripts, not
#: into ``_bin`` (a script of the distribution, installed beside ``execgate-py``).
ENTRY = "execgate"
ENTRY_SOURCES = ["entry.c", *FRONT]

#: Written next to the binaries: each one's SHA-256, checked whenever a session opens
#: (``execgate.native.verified_native``), so a replaced file is refused, not loaded.
MANIFEST = "manifest.json"

CFLAGS = ["-std=gnu11", "-O2", "-g", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-unused-parameter"]


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc"))


def _stale(output: Path, sources: list[Path]) -> bool:
    if not output.exists():
        return True
    built = output.stat().st_mtime
    deps = sources + list(NATIVE.glob("*.h")) + [Path(__file__)]
    return any(dep.stat().st_mtime > built for dep in deps)


def build(out_dir: Path, *, force: bool = False) -> list[Path]:
    """Build every target into ``out_dir``; return the paths of the built files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = []
    for name, (srcs, flags) in TARGETS.items():
        outputs.append(compile_program(out_dir / name, srcs, flags, force=force))
    outputs.append(write_manifest(out_dir, outputs))
    return outputs


def build_entry(out_dir: Path, *, force: bool = False) -> Path:
    """Build the ``execgate`` command into ``out_dir``; its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return compile_program(out_dir / ENTRY, ENTRY_SOURCES, [], force=force)


def compile_program(output: Path, srcs: list[str], flags: list[str], *, force: bool) -> Path:
    """Compile ``srcs`` (in native/) into ``output``, unless it is newer than them."""
    sources = [NATIVE / s for s in srcs]
    if not force and not _stale(output, sources):
        return output
    extra = shlex.split(os.environ.get("CFLAGS", ""))
    tmp = output.with_name(output.name + ".tmp")
    cmd = [*_compiler(), *CFLAGS, *extra, *flags, "-o", str(tmp), *map(str, sources)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SystemExit(f"native build failed: {shlex.join(cmd)}")
    if result.stderr:
        sys.stderr.write(result.stderr)
    tmp.replace(output)  # atomic: a running test never sees a half-written binary
    return output


def write_manifest(out_dir: Path, files: list[Path]) -> Path:
    """Record the SHA-256 of every built file in ``out_dir/manifest.json``."""
    digests = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    manifest = out_dir / MANIFEST
    tmp = manifest.with_name(manifest.name + ".tmp")
    tmp.write_text(json.dumps({"sha256": digests}, indent=1, sort_keys=True) + "\n")
    tmp.replace(manifest)
    return manifest


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else NATIVE.parent / "src/execgate/_bin"
    for path in build(target, force="--force" in sys.argv):
        print(path)
