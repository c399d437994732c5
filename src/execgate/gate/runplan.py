"""The start-up plan of ``execgate run`` (docs/protocol.md §8): what the native front
(``execgate-run``, native/front.c) needs to open a session without Python, and every input that
produced it.

The slow path (the Python ``execgate run``) writes a plan once its session is open, for runs it
can prove the plan covers (:func:`ineligible`): ``$EXECGATE_HOME/cache/run-plans/<key>``, 0600,
replaced atomically. The front follows a plan only while every input it lists is still what the
slow path saw: each file and folder it read or looked for (absent ones too) by identity, the
environment variables the opening reads, the user, the working directory, the option words and
the kernel's boot id. The server it starts (execgate/adopt.py) reads the same plan from the
descriptor the front used and checks that what it computes itself equals it; a difference ends
the session and deletes the plan (fail closed).

Lines of ``KIND FIELD…``, single spaces, every text field %XX-escaped (bytes outside ``!``..``~``
and ``%``), first ``EGPLAN 2``, last ``end``.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

# The server of a native start reads a plan (read_fd) before anything else: no dataclasses,
# no execgate modules beyond this one at import (the writer's are imported where used).

#: The plan's version: the front's and its server's (native/front.c, execgate/adopt.py). Part of
#: the plan's name, so that two installed versions never follow each other's plans.
MAGIC = "EGPLAN 2"

#: Every environment variable the opening of ``execgate run`` reads (paths.py, the policy's
#: layers and cache, the sandbox's guards, the decision log's export, tempfile): the plan holds
#: each one's value, or that it was unset.
OPENING_VARIABLES = (
    "HOME",
    "PATH",
    "LD_PRELOAD",
    "EXECGATE_HOME",
    "EXECGATE_SYSTEM_DIR",
    "EXECGATE_CODEX_SYSTEM_DIR",
    "EXECGATE_NO_CACHE",
    "EXECGATE_DEBUG",
    "CODEX_HOME",
    "XDG_RUNTIME_DIR",
    "XDG_STATE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "TMPDIR",
    "TEMP",
    "TMP",
    "OTEL_SDK_DISABLED",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
    "OTEL_SERVICE_NAME",
    # a sandboxed session's: the multiplexers' socket folders it hides (sandbox/guarded.py),
    # the user site-packages it keeps read-only
    "TMUX",
    "TMUX_TMPDIR",
    "SCREENDIR",
    "PYTHONUSERBASE",
)

#: The launcher options a front fills in per session (``launch-session NAME``: the session
#: folder's NAME, ``.`` the folder itself; ``launch-carveouts``: the protected names that
#: exist when it starts, as ``--known-carveouts`` wants them, sandbox/spec.py's
#: ``existing_carveouts``).
SESSION_PLACEHOLDER = "launch-session"
CARVEOUTS_PLACEHOLDER = "launch-carveouts"

_SAFE = frozenset(range(0x21, 0x7F)) - {ord("%")}


def escape(text: str | bytes) -> str:
    raw = os.fsencode(text)
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)


def unescape(field_: str) -> str:
    return os.fsdecode(_unescape_bytes(field_))


def _unescape_bytes(field_: str) -> bytes:
    out = bytearray()
    i = 0
    while i < len(field_):
        if field_[i] == "%":
            out.append(int(field_[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(ord(field_[i]))
            i += 1
    return bytes(out)


def plan_key(uid: int, front: str, cwd: str, options: Sequence[str]) -> str:
    """FNV-1a 64 of ``MAGIC\\0UID\\0FRONT\\0CWD\\0OPTION\\0…`` in hex: the plan's file name
    (an index only: a collision finds a plan whose lines do not hold). ``front``: the native
    front's program the plan is for (one installation never follows another's plan)."""
    h = 0xCBF29CE484222325
    for part in (MAGIC, str(uid), front, cwd, *options):
        for byte in os.fsencode(part) + b"\0":
            h = ((h ^ byte) * 0x100000001B3) & ((1 << 64) - 1)
    return f"{h:016x}"


def plans_dir() -> Path:
    from execgate import paths

    return paths.cache_dir() / "run-plans"


def plan_path(front: str, cwd: str, options: Sequence[str]) -> Path:
    return plans_dir() / plan_key(os.getuid(), front, cwd, options)


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


class Plan:
    """What a plan says (the fields the server checks; the inputs are the front's)."""

    def __init__(self) -> None:
        #: the native front the plan is for (its program's path)
        self.front = ""
        self.python = ""
        #: how the slow path was started (its ``sys.argv[0]``): the server takes it as its own,
        #: so it finds execgate's installation as that path did (sandbox/guarded.py)
        self.argv0 = ""
        self.syspath: list[str] = []
        self.interposer = ""
        self.wrapper = ""
        self.launcher = ""
        self.sessions = ""
        #: the decision log (``""``: off), its rotation size and how many rotated files are kept
        self.log = ""
        self.log_max_bytes = 0
        self.log_keep = 0
        #: the decision log's ``sandbox`` (``off (no confinement)``)
        self.sandbox = ""
        self.launch_options: list[str] = []
        #: the programs a sandboxed session's stand-ins cover, in the order of their names
        #: (``standins/0``, ``standins/1``, …; gate/standins.py)
        self.standins: list[str] = []
        self.snapshot = b""
        self.cwd = ""
        self.options: list[str] = []


class Unplannable(Exception):
    """An input the plan cannot describe (unreadable, not a file or folder): no plan."""


def identity_line(path: Path) -> str:
    """``file PATH DEV INO SIZE MTIME_NS CTIME_NS`` (lstat), or ``absent PATH``."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return f"absent {escape(os.fspath(path))}"
    except OSError as exc:
        raise Unplannable(f"{path}: {exc.strerror}") from None
    return (
        f"file {escape(os.fspath(path))} {st.st_dev} {st.st_ino} {st.st_size} "
        f"{st.st_mtime_ns} {st.st_ctime_ns}"
    )


def folder_line(path: Path) -> str:
    """``dir PATH DEV INO`` for a folder (lstat): one whose identity matters, not its times
    (``/tmp``, a writable root, a folder a sandbox keeps read-only); else
    :func:`identity_line`."""
    try:
        st = os.lstat(path)
    except OSError:
        return identity_line(path)
    if not stat.S_ISDIR(st.st_mode):
        return identity_line(path)
    return f"dir {escape(os.fspath(path))} {st.st_dev} {st.st_ino}"


def _with_targets(found: Iterable[Path]) -> Iterator[Path]:
    """Each path and, when it or a folder above it is a link, the path it resolves to."""
    for path in found:
        path = Path(os.path.abspath(path))
        yield path
        real = Path(os.path.realpath(path))
        if real != path:
            yield real


def package_files() -> list[Path]:
    """The installed ``execgate`` package: every folder and file (sources, ``_bin``), so an
    upgrade or an edit changes an identity. ``__pycache__`` is Python's, left out."""
    root = Path(__file__).resolve().parent.parent
    found = [root]
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [Path(folder, d) for d in dirs]
        found += [Path(folder, f) for f in sorted(files)]
    return found


def ancestors_markers(cwd: Path) -> list[Path]:
    """What the layers look for from ``cwd`` up (policy/layers.py): ``.git`` (the project
    root) and each folder's project rules folders. Not the folders themselves: their times
    change with every file made in them (``/tmp``), and what matters in them is listed."""
    found = []
    for folder in (cwd, *cwd.parents):
        found += [folder / ".git", folder / ".execgate", folder / ".codex"]
        found += [folder / ".execgate" / "rules", folder / ".codex" / "rules"]
    return found


def render(
    *,
    front: str,
    cwd: str,
    options: Sequence[str],
    inputs: Iterable[Path],
    snapshot: bytes,
    sessions: Path,
    log: tuple[str, int, int] | None,
    sandbox: str,
    launch_options: Sequence[str] = (),
    session_dir: Path | None = None,
    standins: Sequence[str] = (),
    folders: Iterable[Path] = (),
) -> str:
    """The plan's text (raises :class:`Unplannable`). ``launch_options`` name ``session_dir``
    (this session's folder) only as ``--shadows <session_dir>/NAME`` and give the known
    carve-outs after ``--known-carveouts``: both differ per session, so the plan holds
    placeholders the front fills in. ``folders``: inputs whose identity matters, not their
    times (a sandbox's; :func:`folder_line`), unless listed in ``inputs`` as well."""
    lines = [MAGIC, f"boot {boot_id()}", f"uid {os.getuid()} {os.getgid()}"]
    lines += [f"front {escape(front)}", f"cwd {escape(cwd)}"]
    lines += [f"opt {escape(word)}" for word in options]
    for name in OPENING_VARIABLES:
        value = os.environ.get(name)
        lines.append(f"noenv {name}" if value is None else f"env {name} {escape(value)}")
    seen: set[Path] = set()
    for path in _with_targets(inputs):
        if path not in seen:
            seen.add(path)
            lines.append(identity_line(path))
    for path in _with_targets(folders):
        if path not in seen:
            seen.add(path)
            lines.append(folder_line(path))
    from execgate import native

    lines.append(f"python {escape(sys.executable)}")
    lines.append(f"argv0 {escape(os.path.abspath(sys.argv[0]) if sys.argv[0] else '')}")
    package_parent = str(Path(__file__).resolve().parent.parent.parent)
    # not the working directory `python -m` puts first (the server runs with -I)
    for entry in [package_parent, *sys.path]:
        if entry and os.path.isabs(entry) and entry != cwd:
            lines.append(f"syspath {escape(entry)}")
    lines.append(f"interposer {escape(os.fspath(native.native_path(native.INTERPOSER)))}")
    lines.append(f"wrapper {escape(os.fspath(native.native_path(native.WRAPPER)))}")
    lines.append(f"launcher {escape(os.fspath(native.native_path(native.LAUNCHER)))}")
    lines.append(f"sessions {escape(os.fspath(sessions))}")
    if log is None:
        lines.append("server nolog")
    else:
        lines.append(f"server log {escape(log[0])} {log[1]} {log[2]}")
    lines.append(f"server sandbox {escape(sandbox)}")
    lines += _launch_lines(launch_options, session_dir)
    lines += [f"standin {escape(program)}" for program in standins]
    lines.append(f"snapshot {snapshot.hex()}")
    lines.append("end")
    return "\n".join(lines) + "\n"


def _launch_lines(options: Sequence[str], session_dir: Path | None) -> list[str]:
    lines = []
    folder = os.fspath(session_dir) + "/" if session_dir is not None else None
    after = ""
    for word in options:
        if after == "--known-carveouts":
            lines.append(CARVEOUTS_PLACEHOLDER)
        elif folder and word + "/" == folder:  # (read-only, inside a writable root)
            lines.append(f"{SESSION_PLACEHOLDER} .")
        elif after == "--shadows" and folder and word.startswith(folder):
            lines.append(f"{SESSION_PLACEHOLDER} {escape(word[len(folder) :])}")
        elif folder and (word + "/").startswith(folder):
            raise Unplannable("the sandbox names the session folder")
        else:
            lines.append(f"launch {escape(word)}")
        after = word
    return lines


def fill_in(plan: Plan, session_dir: Path, carveouts: str) -> list[str]:
    """The launcher options of ``plan`` as the front filled them in for this session."""
    return [
        os.fspath(session_dir / word[len(SESSION_PLACEHOLDER) + 1 :])
        if word.startswith(SESSION_PLACEHOLDER + " ")
        else carveouts
        if word == CARVEOUTS_PLACEHOLDER
        else word
        for word in plan.launch_options
    ]


def write(path: Path, text: str) -> None:
    from execgate.files import make_private_dir, write_atomically

    make_private_dir(path.parent)
    write_atomically(path, text.encode("ascii"))  # 0600


def parse(text: str) -> Plan:
    """The fields of a plan's text that the server checks (ValueError when malformed)."""
    lines = text.split("\n")
    if lines[0] != MAGIC or lines[-2:] != ["end", ""]:
        raise ValueError("not a complete start-up plan")
    plan = Plan()
    for line in lines[1:-2]:
        kind, _, rest = line.partition(" ")
        if kind == "syspath":
            plan.syspath.append(unescape(rest))
        elif kind == "launch":
            plan.launch_options.append(unescape(rest))
        elif kind == SESSION_PLACEHOLDER:  # kept as a placeholder: see fill_in
            plan.launch_options.append(f"{kind} {unescape(rest)}")
        elif kind == CARVEOUTS_PLACEHOLDER:
            plan.launch_options.append(kind)
        elif kind == "standin":
            plan.standins.append(unescape(rest))
        elif kind == "opt":
            plan.options.append(unescape(rest))
        elif kind == "snapshot":
            plan.snapshot = bytes.fromhex(rest)
        elif kind == "server" and rest.startswith("log "):
            where, max_bytes, keep = rest[4:].split(" ")
            plan.log, plan.log_max_bytes, plan.log_keep = unescape(where), int(max_bytes), int(keep)
        elif kind == "server" and rest.startswith("sandbox "):
            plan.sandbox = unescape(rest[8:])
        elif kind in (
            "front",
            "python",
            "argv0",
            "interposer",
            "wrapper",
            "launcher",
            "sessions",
            "cwd",
        ):
            setattr(plan, kind, unescape(rest))
    return plan


def read_fd(fd: int) -> Plan:
    """The plan behind ``fd`` (the front's descriptor: the very file it followed)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("the start-up plan is not a regular file")
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return parse(b"".join(chunks).decode("ascii"))
