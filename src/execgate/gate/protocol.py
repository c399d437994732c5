"""The EG1 wire protocol (docs/protocol.md): frames, fields and the typed messages on them.

A frame is a little-endian u32 payload length and a payload of NUL-terminated fields, the first
being ``EG1`` and the second the message type. Fields are bytes: argv and paths need not be
UTF-8. Parsing is strict; anything malformed raises :class:`ProtocolError` and the caller closes
the connection (the client then treats the exec as denied).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

TAG = b"EG1"
HEADER = struct.Struct("<I")
MAX_PAYLOAD = 16 << 20
MAX_FDS = 253
# #! levels an exec request may carry (the kernel follows at most four).
MAX_INTERPRETERS = 4

Field = bytes | str | int


class ProtocolError(Exception):
    """A peer sent something that is not a well-formed EG1 message."""


def _field(value: Field) -> bytes:
    if isinstance(value, bytes):
        field = value
    elif isinstance(value, str):
        field = value.encode("utf-8", "surrogateescape")
    else:
        field = str(value).encode("ascii")
    if b"\0" in field:
        raise ProtocolError("a field cannot contain NUL")
    return field


def encode(kind: str, *fields: Field) -> bytes:
    """One complete frame (header included) of message ``kind`` with ``fields``."""
    parts = [TAG, kind.encode("ascii"), *map(_field, fields)]
    payload = b"\0".join(parts) + b"\0"
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"message too large: {len(payload)}")
    return HEADER.pack(len(payload)) + payload


def encode_fields(kind: str, head: Sequence[Field], counted: Iterable[Sequence[Field]]) -> bytes:
    """A frame whose tail is one or more counted lists (``N · item…``), e.g. argv and env."""
    fields: list[Field] = list(head)
    for items in counted:
        fields.append(len(items))
        fields.extend(items)
    return encode(kind, *fields)


def split_payload(payload: bytes) -> list[bytes]:
    """The fields of a payload after the tag, checked: ``[kind, field…]``."""
    if not payload.endswith(b"\0"):
        raise ProtocolError("payload does not end with a NUL")
    fields = payload[:-1].split(b"\0")
    if len(fields) < 2 or fields[0] != TAG:
        raise ProtocolError("not an EG1 message")
    return fields[1:]


def parse_int(field: bytes, what: str) -> int:
    # int() accepts "+1", " 1", "1_0": the protocol only allows plain decimal.
    body = field[1:] if field.startswith(b"-") else field
    if not body.isdigit() or len(field) > 20:
        raise ProtocolError(f"{what} is not a decimal integer: {field[:40]!r}")
    return int(field)


def _counted(fields: list[bytes], at: int, what: str) -> tuple[tuple[bytes, ...], int]:
    """Read ``N · item…`` starting at ``fields[at]``; return the items and the next index."""
    if at >= len(fields):
        raise ProtocolError(f"missing {what} count")
    count = parse_int(fields[at], f"{what} count")
    end = at + 1 + count
    if count < 0 or end > len(fields):
        raise ProtocolError(f"{what} count {count} does not match the message")
    return tuple(fields[at + 1 : end]), end


# -- exec decision (client -> server) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """A process asking whether it may execute a program (protocol §3).

    Everything here is a claim of the asking process. What runs are the descriptors that came
    with the request (the program, then one per ``#!`` interpreter); the server derives the
    files' identities from those (:mod:`execgate.gate.identity`).
    """

    token: bytes
    via: str
    pid: int
    ppid: int
    cwd: bytes
    path: bytes  # the program as named (a claim: it may only add rule matches)
    interpreters: tuple[tuple[bytes, bytes], ...]  # (name, argument) of each #! level
    argv: tuple[bytes, ...]


_NINTERP_INDEX = 7  # kind, token, via, pid, ppid, cwd, path, then NINTERP


def parse_exec_request(fields: list[bytes]) -> ExecRequest:
    if len(fields) <= _NINTERP_INDEX or fields[0] != b"exec":
        raise ProtocolError("malformed exec request")
    ninterp = parse_int(fields[_NINTERP_INDEX], "interpreter count")
    argc_at = _NINTERP_INDEX + 1 + 2 * ninterp
    if not 0 <= ninterp <= MAX_INTERPRETERS or argc_at >= len(fields):
        raise ProtocolError("bad interpreter count")
    pairs = fields[_NINTERP_INDEX + 1 : argc_at]
    argv, end = _counted(fields, argc_at, "argv")
    if end != len(fields):
        raise ProtocolError("trailing fields after argv")
    return ExecRequest(
        token=fields[1],
        via=fields[2].decode("ascii", "replace"),
        pid=parse_int(fields[3], "pid"),
        ppid=parse_int(fields[4], "ppid"),
        cwd=fields[5],
        path=fields[6],
        interpreters=tuple(zip(pairs[0::2], pairs[1::2], strict=True)),
        argv=argv,
    )


def encode_exec_request(req: ExecRequest) -> bytes:
    head: list[Field] = [req.token, req.via, req.pid, req.ppid, req.cwd, req.path]
    head.append(len(req.interpreters))
    for name, arg in req.interpreters:
        head += [name, arg]
    return encode_fields("exec", head, [req.argv])


# -- answers (server -> client) --------------------------------------------------------------

RUN = encode("run")


def encode_deny(message: str) -> bytes:
    return encode("deny", message.replace("\0", "").replace("\n", " "))


def encode_escalate(ticket: str) -> bytes:
    return encode("escalate", ticket)


def encode_exit(code: int) -> bytes:
    return encode("exit", code)


def encode_signal(signum: int) -> bytes:
    return encode("signal", signum)


# -- escalation claim (claimer -> launcher's claim socket) ----------------------------------


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """A claimer (the interposer in the exec'ing process, or the wrapper) claiming an
    escalation ticket with its descriptors and environment (§4)."""

    token: bytes
    ticket: bytes
    fd_numbers: tuple[int, ...]
    env: tuple[bytes, ...]


def parse_claim(fields: list[bytes]) -> ClaimRequest:
    if len(fields) < 4 or fields[0] != b"claim":
        raise ProtocolError("malformed claim")
    numbers, at = _counted(fields, 3, "fd")
    env, end = _counted(fields, at, "env")
    if end != len(fields):
        raise ProtocolError("trailing fields after env")
    fd_numbers = tuple(parse_int(n, "fd number") for n in numbers)
    if len(fd_numbers) > MAX_FDS or any(n < 0 for n in fd_numbers):
        raise ProtocolError("bad descriptor numbers")
    return ClaimRequest(token=fields[1], ticket=fields[2], fd_numbers=fd_numbers, env=env)


def encode_claim(claim: ClaimRequest) -> bytes:
    return encode_fields("claim", [claim.token, claim.ticket], [claim.fd_numbers, claim.env])


def parse_signal(fields: list[bytes]) -> int:
    if len(fields) != 2 or fields[0] != b"signal":
        raise ProtocolError("malformed signal message")
    signum = parse_int(fields[1], "signal number")
    if not 0 < signum < 65:
        raise ProtocolError(f"bad signal number {signum}")
    return signum


# -- launcher control channel (§7) -----------------------------------------------------------


def encode_spawn(
    spawn_id: int,
    *,
    flags: Sequence[str],
    pgid: int,
    cwd: bytes,
    path: bytes,
    fd_targets: Sequence[int],
    argv: Sequence[bytes],
    env: Sequence[bytes],
) -> bytes:
    head: list[Field] = [spawn_id, ",".join(flags), pgid, cwd, path]
    return encode_fields("spawn", head, [list(fd_targets), argv, env])


def encode_release(
    spawn_id: int,
    *,
    last: bool,
    cwd: bytes,
    fd_targets: Sequence[int],
    argv: Sequence[bytes],
    env: Sequence[bytes],
) -> bytes:
    """§7 "Held spawns": the call a held spawn takes (what follows LAST goes to it as is)."""
    head: list[Field] = [spawn_id, int(last), cwd]
    return encode_fields("release", head, [list(fd_targets), argv, env])


@dataclass(frozen=True, slots=True)
class EnvRules:
    """How the launcher turns a claimer's environment into the escalated program's (§7
    ``authorize``), applied in this order:

    * entries without ``=`` and names in ``drop`` are removed;
    * names starting with one of ``drop_prefixes`` are removed unless the whole ``NAME=value``
      entry is one of ``keep``;
    * names that ``set`` assigns are removed;
    * of a name that is still repeated, the last value wins, at the place of the first;
    * the ``set`` entries (``NAME=value``) are appended.
    """

    drop: tuple[bytes, ...] = ()
    drop_prefixes: tuple[bytes, ...] = ()
    keep: tuple[bytes, ...] = ()
    set: tuple[bytes, ...] = ()
    # The four counted lists as they go on the wire (every escalation sends them).
    wire: bytes = field(init=False, repr=False, compare=False, default=b"")

    def __post_init__(self) -> None:
        if any(b"=" not in entry for entry in self.set):
            raise ValueError("EnvRules.set entries must be NAME=value")
        lists = (self.drop, self.drop_prefixes, self.keep, self.set)
        fields = [f for items in lists for f in (str(len(items)).encode(), *items)]
        if any(b"\0" in f for f in fields):
            raise ProtocolError("a field cannot contain NUL")
        object.__setattr__(self, "wire", b"".join(f + b"\0" for f in fields))

    def apply(self, env: Iterable[bytes]) -> list[bytes]:
        """The same computation as the launcher's (the session's own command uses it)."""
        drop = set(self.drop)
        keep = set(self.keep)
        assigned = {entry.partition(b"=")[0] for entry in self.set}
        kept: dict[bytes, bytes] = {}
        for entry in env:
            name, sep, _ = entry.partition(b"=")
            if not sep or name in drop or name in assigned:
                continue
            if name.startswith(self.drop_prefixes) and entry not in keep:
                continue
            kept[name] = entry
        return [*kept.values(), *self.set]


class Authorization:
    """An ``authorize`` message (§7) for any ticket: everything but the ticket is encoded
    once, so a loop that escalates the same command over and over pays for its argv, its
    command line and the environment rules once, and a byte concatenation per exec."""

    __slots__ = ("_head", "_tail")

    def __init__(
        self,
        *,
        lifetime_ms: int,
        token: bytes,
        display: str,
        path: bytes,
        cwd: bytes,
        argv: Sequence[bytes],
        env: EnvRules,
        confined: bool = False,
    ) -> None:
        kind = b"authorize-confined" if confined else b"authorize"
        after = [
            b"%d" % lifetime_ms, token, display.encode("utf-8", "surrogateescape"), path, cwd,
            b"%d" % len(argv), *argv,
        ]  # fmt: skip
        tail = b"\0".join(after) + b"\0"
        if tail.count(b"\0") != len(after):
            raise ProtocolError("a field cannot contain NUL")
        self._head = TAG + b"\0" + kind + b"\0"
        self._tail = b"\0" + tail + env.wire
        if len(self._head) + len(self._tail) + 255 > MAX_PAYLOAD:
            raise ProtocolError(f"message too large: {len(self._head) + len(self._tail)}")

    def frame(self, ticket: bytes) -> bytes:
        """The complete frame that authorizes ``ticket`` (1 to 255 bytes, no NUL)."""
        if not 0 < len(ticket) < 256 or b"\0" in ticket:
            raise ProtocolError("a ticket is 1 to 255 bytes without NUL")
        size = len(self._head) + len(ticket) + len(self._tail)
        return HEADER.pack(size) + self._head + ticket + self._tail


@dataclass(frozen=True, slots=True)
class JudgedFile:
    """What the server's ``fstat`` of a judged descriptor said: a standing authorization
    holds only while the launcher's own ``fstat`` says the same (§7 ``standing``)."""

    dev: int
    ino: int
    ctime_ns: int
    mtime_ns: int
    size: int
    mode: int
    nlink: int

    @classmethod
    def of(cls, st: os.stat_result) -> JudgedFile:
        return cls(st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size,
                   st.st_mode, st.st_nlink)  # fmt: skip


def encode_standing(
    standing_id: int,
    *,
    token: bytes,
    display: str,
    path: bytes,
    realpath: bytes,
    cwd: bytes,
    judged: JudgedFile,
    standin: tuple[int, int],
    argv: Sequence[bytes],
    env: EnvRules,
) -> bytes:
    """A ``standing`` message (§7): claims of exactly this exec need not ask the server.
    ``standin``: the (dev, ino) of the stand-in the request came through (§5)."""
    standin_dev, standin_ino = standin
    head: list[Field] = [
        standing_id, token, display.replace("\n", " ").encode("utf-8", "surrogateescape"),
        path, realpath, cwd, judged.dev, judged.ino, judged.ctime_ns, judged.mtime_ns,
        judged.size, judged.mode, judged.nlink, standin_dev, standin_ino, len(argv), *argv,
    ]  # fmt: skip
    frame = encode("standing", *head)
    return HEADER.pack(len(frame) - HEADER.size + len(env.wire)) + frame[HEADER.size :] + env.wire


def encode_revoke() -> bytes:
    return encode("revoke")


def encode_launcher_signal(spawn_id: int, signum: int) -> bytes:
    return encode("signal", spawn_id, signum)


def encode_shutdown(grace_ms: int) -> bytes:
    return encode("shutdown", grace_ms)


@dataclass(frozen=True, slots=True)
class Spawned:
    spawn_id: int
    pid: int


@dataclass(frozen=True, slots=True)
class SpawnFailed:
    spawn_id: int
    errno: int
    message: str


@dataclass(frozen=True, slots=True)
class Exited:
    spawn_id: int
    wait_status: int


@dataclass(frozen=True, slots=True)
class Ended:
    """Nothing of the session is left (the ``last`` program's ``exited`` follows; §7)."""


LauncherEvent = Spawned | SpawnFailed | Exited | Ended


@dataclass(frozen=True, slots=True)
class Stood:
    """A standing authorization was claimed by process ``pid``, whose parent was ``ppid`` (0:
    unknown), at ``time`` (seconds since the epoch): the launcher escalated it then, and its
    program starts right after (or fails to, and its claimer is denied; §7, the report
    socket)."""

    standing_id: int
    pid: int
    ppid: int
    time: float


def parse_stood(datagram: bytes) -> Stood:
    """One report of the standing-claims socket: a whole frame (header and payload)."""
    if len(datagram) <= HEADER.size or HEADER.unpack_from(datagram)[0] != len(datagram) - 4:
        raise ProtocolError("a standing report is not one whole frame")
    fields = split_payload(datagram[HEADER.size :])
    if fields[0] != b"stood" or len(fields) != 5:
        raise ProtocolError(f"unknown standing report {fields[0][:20]!r}")
    return Stood(
        parse_int(fields[1], "id"),
        parse_int(fields[2], "pid"),
        parse_int(fields[3], "ppid"),
        parse_int(fields[4], "time") / 1e6,
    )


def parse_launcher_event(fields: list[bytes]) -> LauncherEvent:
    kind = fields[0]
    if kind == b"spawned" and len(fields) == 3:
        return Spawned(parse_int(fields[1], "id"), parse_int(fields[2], "pid"))
    if kind == b"failed" and len(fields) == 4:
        return SpawnFailed(
            parse_int(fields[1], "id"),
            parse_int(fields[2], "errno"),
            fields[3].decode("utf-8", "replace"),
        )
    if kind == b"exited" and len(fields) == 3:
        return Exited(parse_int(fields[1], "id"), parse_int(fields[2], "wait status"))
    if kind == b"ended" and len(fields) == 1:
        return Ended()
    raise ProtocolError(f"unknown launcher message {kind[:20]!r}")
