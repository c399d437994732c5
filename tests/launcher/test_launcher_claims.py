"""Escalation claims served by execgate-launch itself (docs/protocol.md §4, §7): the server
authorizes a ticket on the control channel, a claimer connects to the claim socket with its
descriptors and environment, and the launcher runs the program and answers its end.

The claimers here are plain sockets speaking the protocol (so every edge can be reached); the
interposer and the wrapper as claimers are covered in tests/native and tests/gate."""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import pytest
from egtest_launch import PYTHON, TIMEOUT, run

from execgate.gate import protocol as P
from execgate.gate.launcher import Launcher, authorization

TOKEN = b"ab" * 16
NO_RULES = P.EnvRules()


@contextlib.asynccontextmanager
async def launcher_with_claims(*, new_session: bool = True) -> AsyncIterator[Launcher]:
    folder = Path(tempfile.mkdtemp(prefix="egc", dir="/tmp"))  # short: sun_path is 108 bytes
    launcher = await Launcher.start(None, new_session=new_session, claim_path=folder / "c.sock")
    try:
        yield launcher
    finally:
        await launcher.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


def authorize(
    launcher: Launcher,
    ticket: str,
    argv: Sequence[str],
    *,
    cwd: str = "/",
    env: P.EnvRules = NO_RULES,
    lifetime: float = 30.0,
    token: bytes = TOKEN,
    at_once: bool = True,
) -> asyncio.Future[None]:
    """Authorize ``ticket``: done once written (queued while the socket is full). at_once:
    it must be in the socket now, so that a claim can follow without an await."""
    path = shutil.which(argv[0]) or argv[0]
    program = os.open(path, os.O_PATH | os.O_CLOEXEC)  # what the launcher executes
    try:
        allowed = authorization(
            token=token,
            display=" ".join(argv),
            path=os.fsencode(path),
            argv=[os.fsencode(a) for a in argv],
            cwd=os.fsencode(cwd),
            env=env,
            lifetime=lifetime,
        )
        posted = launcher.authorize(ticket, allowed, program)
    finally:
        os.close(program)
    assert not at_once or (posted.done() and posted.exception() is None)
    return posted


class Claimer:
    """One claim connection, with blocking I/O (the launcher needs nothing from our loop to
    serve it; the socket timeout only guards against a hang)."""

    def __init__(self, launcher: Launcher) -> None:
        assert launcher.claim_path is not None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect(os.fspath(launcher.claim_path))

    def send(self, data: bytes, fds: Sequence[int] = ()) -> None:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        sent = self.sock.sendmsg([data], rights)
        if sent < len(data):  # (sendall of nothing would still write: EPIPE if answered)
            self.sock.sendall(data[sent:])

    def claim(
        self,
        ticket: str,
        fds: Mapping[int, int],
        env: Sequence[bytes] = (),
        token: bytes = TOKEN,
    ) -> None:
        self.send(claim_frame(ticket, list(fds), env, token), list(fds.values()))

    def signal(self, signum: int) -> None:
        self.send(P.encode("signal", signum))

    def answer(self) -> tuple[str, str] | None:
        """(kind, argument) of the launcher's answer; None if it closed without one."""
        data = b""
        while len(data) < 4 or len(data) < 4 + P.HEADER.unpack_from(data)[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                assert not data, "closed in the middle of a frame"
                return None
            data += chunk
        kind, arg = P.split_payload(data[4:])
        return kind.decode(), arg.decode()

    def close(self) -> None:
        self.sock.close()


def claim_frame(
    ticket: str, targets: Sequence[int], env: Sequence[bytes], token: bytes = TOKEN
) -> bytes:
    claim = P.ClaimRequest(
        token=token, ticket=ticket.encode(), fd_numbers=tuple(targets), env=tuple(env)
    )
    return P.encode_claim(claim)


def until_eof(fd: int) -> bytes:
    data = b""
    while True:
        assert select.select([fd], [], [], TIMEOUT)[0], "no end-of-file"
        chunk = os.read(fd, 65536)
        if not chunk:
            return data
        data += chunk


def simple_claim(launcher: Launcher, ticket: str, env: Sequence[bytes] = ()) -> Claimer:
    with open(os.devnull, "r+b") as null:
        c = Claimer(launcher)
        c.claim(ticket, {0: null.fileno(), 1: null.fileno(), 2: null.fileno()}, env)
    return c


def scenario(fn: Callable[[Launcher], Awaitable[None] | None], **kw: bool) -> None:
    async def go() -> None:
        async with launcher_with_claims(**kw) as launcher:
            done = fn(launcher)
            if done is not None:
                await done

    run(go)


PROBE = r"""
import os, sys
def is_open(fd):
    try: return os.fstat(fd) is not None
    except OSError: return False
fds = [fd for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")) if is_open(fd)]
print(sys.argv[1:], os.getcwd(), fds, flush=True)
os.write(5, b"five")
sys.exit(7)
"""


def test_a_claim_runs_the_authorized_program_on_the_claimed_descriptors(tmp_path: Path) -> None:
    def go(launcher: Launcher) -> None:
        authorize(launcher, "t1", [PYTHON, "-S", "-c", PROBE, "a", "", "b c"], cwd=str(tmp_path))
        r, w = os.pipe()
        with open(tmp_path / "five", "wb") as five, open(os.devnull, "rb") as null:
            c = Claimer(launcher)
            c.claim("t1", {0: null.fileno(), 1: w, 2: w, 5: five.fileno()})
        os.close(w)
        assert c.answer() == ("exit", "7")
        c.close()
        assert until_eof(r) == f"['a', '', 'b c'] {tmp_path} [0, 1, 2, 5]\n".encode()
        os.close(r)

    scenario(go)
    assert (tmp_path / "five").read_bytes() == b"five"


def test_the_environment_is_the_claimers_through_the_rules() -> None:
    rules = P.EnvRules(
        drop=(b"EXECGATE_TOKEN", b"LD_PRELOAD"),
        drop_prefixes=(b"LD_",),
        keep=(b"LD_LIBRARY_PATH=/base",),
        set=(b"SET=gate", b"GATE=1"),
    )
    claimed = [
        b"A=1", b"NOEQUALS", b"EXECGATE_TOKEN=stolen", b"LD_PRELOAD=/evil.so",
        b"LD_LIBRARY_PATH=/base", b"LD_AUDIT=/evil.so", b"B=first", b"A=2", b"X=\xff\xfe=",
        b"LD_LIBRARY_PATH=/other", b"SET=mine", b"=no-name", b"EMPTY=",
    ]  # fmt: skip
    expected = [
        b"A=2", b"LD_LIBRARY_PATH=/base", b"B=first", b"X=\xff\xfe=", b"=no-name", b"EMPTY=",
        b"SET=gate", b"GATE=1",
    ]  # fmt: skip
    assert rules.apply(claimed) == expected  # the server's own copy of the rules

    def go(launcher: Launcher) -> None:
        dump = "import sys; sys.stdout.buffer.write(open('/proc/self/environ', 'rb').read())"
        authorize(launcher, "env", [PYTHON, "-S", "-c", dump], env=rules)
        r, w = os.pipe()
        with open(os.devnull, "r+b") as null:
            c = Claimer(launcher)
            c.claim("env", {0: null.fileno(), 1: w, 2: null.fileno()}, claimed)
        os.close(w)
        assert c.answer() == ("exit", "0")
        environ = until_eof(r)
        os.close(r)
        assert environ.split(b"\0")[:-1] == expected

    scenario(go)


def test_exit_codes_signal_deaths_and_exec_failures_are_answered() -> None:
    def go(launcher: Launcher) -> None:
        authorize(launcher, "code", ["/bin/sh", "-c", "exit 42"])
        authorize(launcher, "sig", ["/bin/sh", "-c", "kill -TERM $$"])
        with tempfile.NamedTemporaryFile(prefix="egt-noexec") as plain:  # no x bits
            authorize(launcher, "noexec", [plain.name, "arg"])
            noexec = simple_claim(launcher, "noexec").answer()
        assert simple_claim(launcher, "code").answer() == ("exit", "42")
        assert simple_claim(launcher, "sig").answer() == ("signal", str(int(signal.SIGTERM)))
        assert noexec == (
            "deny",
            f"execgate: cannot run {plain.name} arg: exec {plain.name}: Permission denied",
        )

    scenario(go)


def test_unknown_expired_reused_and_foreign_tickets_are_denied() -> None:
    unknown = ("deny", "execgate: escalation ticket unknown or expired")

    def go(launcher: Launcher) -> None:
        assert simple_claim(launcher, "never-authorized").answer() == unknown
        authorize(launcher, "expired", ["/bin/true"], lifetime=0)
        assert simple_claim(launcher, "expired").answer() == unknown
        authorize(launcher, "once", ["/bin/true"])
        assert simple_claim(launcher, "once").answer() == ("exit", "0")
        assert simple_claim(launcher, "once").answer() == unknown  # single use
        authorize(launcher, "theirs", ["/bin/true"])
        with open(os.devnull, "r+b") as null:
            c = Claimer(launcher)
            c.claim("theirs", {0: null.fileno()}, token=b"cd" * 16)
        assert c.answer() == ("deny", "execgate: claim not from this session")
        assert simple_claim(launcher, "theirs").answer() == unknown  # used up by that attempt

    scenario(go)


def test_outstanding_tickets_are_bounded_and_hold_their_program() -> None:
    """Each ticket keeps the judged program's descriptor: at most 256 are outstanding (the
    oldest goes), and a ticket runs its file even after the path names another one."""
    unknown = ("deny", "execgate: escalation ticket unknown or expired")

    async def go(launcher: Launcher) -> None:
        with tempfile.TemporaryDirectory(prefix="egt-tk") as tmp:
            prog = Path(tmp) / "prog"
            shutil.copy2("/bin/true", prog)
            authorize(launcher, "judged", [str(prog)])
            shutil.copy2("/bin/false", Path(tmp) / "other")
            os.replace(Path(tmp) / "other", prog)  # the path now names another file
            assert simple_claim(launcher, "judged").answer() == ("exit", "0")
        posted = [authorize(launcher, f"t{i}", ["/bin/true"], at_once=False) for i in range(300)]
        await asyncio.gather(*posted)  # a loaded launcher may leave some queued a while
        # (the newest first: its claim makes the launcher read every pending authorization)
        assert simple_claim(launcher, "t299").answer() == ("exit", "0")
        assert simple_claim(launcher, "t0").answer() == unknown  # dropped: the oldest
        own = len(os.listdir(f"/proc/{launcher.pid}/fd"))
        assert own < 256 + 32, own  # the descriptors of dropped tickets were closed

    scenario(go)


def test_a_half_sent_claim_stalls_nobody() -> None:
    def go(launcher: Launcher) -> None:
        authorize(launcher, "slow", ["/bin/sh", "-c", "exit 3"])
        authorize(launcher, "fast", ["/bin/sh", "-c", "exit 4"])
        with open(os.devnull, "r+b") as null:
            slow = Claimer(launcher)
            frame = claim_frame("slow", [0], [b"A=" + b"x" * 100000])
            slow.send(frame[:3], [null.fileno()])  # not even a whole header
            fast = simple_claim(launcher, "fast")
            assert fast.answer() == ("exit", "4")
            slow.send(frame[3:5000])
            again = Claimer(launcher)
            again.send(b"\xff\xff\xff\x00")  # a frame that claims to be 16 MiB long…
            authorize(launcher, "fast2", ["/bin/true"])
            assert simple_claim(launcher, "fast2").answer() == ("exit", "0")  # …stalls no one
            slow.send(frame[5000:])
        assert slow.answer() == ("exit", "3")

    scenario(go)


def closed_unanswered(c: Claimer) -> bool:
    """The launcher closed the connection without an answer (unread bytes: a reset)."""
    try:
        return c.answer() is None
    except ConnectionResetError:
        return True


def stalled(launcher: Launcher, announced: int, sent: int) -> Claimer:
    """A claimer that announces a frame of `announced` bytes and sends `sent` of them."""
    c = Claimer(launcher)
    c.send(P.HEADER.pack(announced) + b"A" * sent)
    return c


BIG = 16 << 20  # the largest frame


def rss_kib(launcher: Launcher) -> int:
    with open(f"/proc/{launcher.pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))


def test_unfinished_claims_are_bounded_in_bytes_and_big_claims_still_pass() -> None:
    """Two claims of the largest frame fit the budget (§4); a third is closed, and an
    ordinary claim with a big environment passes beside them."""

    def go(launcher: Launcher) -> None:
        first, second = stalled(launcher, BIG, 15 << 20), stalled(launcher, BIG, 15 << 20)
        third = Claimer(launcher)
        third.send(P.HEADER.pack(BIG))
        assert closed_unanswered(third)  # its buffer would exceed the budget
        length = ["/bin/sh", "-c", 'exit "${#BIGVAR}"']  # the exit code shows it arrived
        drop_pad = P.EnvRules(drop_prefixes=(b"PAD",))  # (more would not fit an exec)

        def env(mib: int) -> list[bytes]:
            return [b"BIGVAR=" + b"x" * 200, *(b"PAD%d=" % i + b"y" * (1 << 16) for i in
                                               range(mib * 16))]  # fmt: skip

        authorize(launcher, "mid", length, env=drop_pad)
        assert simple_claim(launcher, "mid", env(6)).answer() == ("exit", "200")
        first.close()  # room for another claim of (nearly) the largest frame
        authorize(launcher, "big", length, env=drop_pad)
        assert simple_claim(launcher, "big", env(15)).answer() == ("exit", "200")
        assert rss_kib(launcher) < 64 * 1024
        second.close()
        authorize(launcher, "after", ["/bin/true"])  # (served once the close was seen)
        assert simple_claim(launcher, "after").answer() == ("exit", "0")
        assert rss_kib(launcher) < 16 * 1024  # the big buffers went back to the system

    scenario(go)


def test_claims_beyond_the_unfinished_bound_wait_their_turn() -> None:
    """16 unfinished claims at once (§4): the next one waits in the listen backlog, unread,
    until one of them is done."""

    def go(launcher: Launcher) -> None:
        authorize(launcher, "next", ["/bin/sh", "-c", "exit 6"])
        slow = [stalled(launcher, 100, 1) for _ in range(16)]
        waiting = simple_claim(launcher, "next")
        assert not select.select([waiting.sock], [], [], 1.0)[0]  # not served
        slow.pop().close()
        assert waiting.answer() == ("exit", "6")
        for c in slow:
            c.close()

    scenario(go)


def test_a_claim_that_stalls_mid_frame_is_closed_at_its_deadline() -> None:
    def go(launcher: Launcher) -> None:
        start = time.monotonic()
        slow = stalled(launcher, 100, 50)
        assert closed_unanswered(slow)  # (within TIMEOUT: the deadline is 30 s)
        assert time.monotonic() - start >= 29.5
        authorize(launcher, "t", ["/bin/true"])
        assert simple_claim(launcher, "t").answer() == ("exit", "0")  # still serving

    scenario(go)


def test_malformed_claims_are_closed_without_an_answer() -> None:
    def go(launcher: Launcher) -> None:
        authorize(launcher, "t", ["/bin/true"])
        for garbage in (
            P.encode("claim", TOKEN, "t", "+1"),  # not a decimal count
            P.encode("exec", TOKEN),  # not a claim
            b"\0\0\0\0",  # empty frame
            b"\x00\x00\x00\x02",  # longer than the largest frame
        ):
            c = Claimer(launcher)
            c.send(garbage)
            assert c.answer() is None, garbage
        c = Claimer(launcher)
        c.send(claim_frame("t", [0, 1], []))  # two numbers, no descriptors attached
        assert c.answer() == ("deny", "execgate: descriptor count mismatch")
        authorize(launcher, "u", ["/bin/true"])
        assert simple_claim(launcher, "u").answer() == ("exit", "0")  # still serving

    scenario(go)


SLEEPER = "import os, time; os.write(1, b'%d\\n' % os.getpid()); time.sleep(1000)"


def test_a_claimer_that_goes_away_takes_its_program_along() -> None:
    def go(launcher: Launcher) -> None:
        authorize(launcher, "t", [PYTHON, "-S", "-c", SLEEPER])
        r, w = os.pipe()
        with open(os.devnull, "r+b") as null:
            c = Claimer(launcher)
            c.claim("t", {0: null.fileno(), 1: w, 2: null.fileno()})
        os.close(w)
        assert select.select([r], [], [], TIMEOUT)[0]
        pid = int(os.read(r, 100))
        pidfd = os.pidfd_open(pid)
        c.close()
        assert select.select([pidfd], [], [], TIMEOUT)[0], "the program is still running"
        os.close(pidfd)
        assert until_eof(r) == b""
        os.close(r)
        authorize(launcher, "u", ["/bin/true"])
        assert simple_claim(launcher, "u").answer() == ("exit", "0")

    scenario(go)


def test_a_big_frame_after_the_claim_is_malformed() -> None:
    """After the claim come `signal` frames, which are small: a big one is not buffered but
    closes the connection, and the program goes with it."""

    def go(launcher: Launcher) -> None:
        authorize(launcher, "t", [PYTHON, "-S", "-c", SLEEPER])
        r, w = os.pipe()
        with open(os.devnull, "r+b") as null:
            c = Claimer(launcher)
            c.claim("t", {0: null.fileno(), 1: w, 2: null.fileno()})
        os.close(w)
        assert select.select([r], [], [], TIMEOUT)[0]
        pidfd = os.pidfd_open(int(os.read(r, 100)))
        c.send(P.HEADER.pack(1 << 20) + b"A" * 1000)
        assert closed_unanswered(c)
        assert select.select([pidfd], [], [], TIMEOUT)[0], "the program is still running"
        os.close(pidfd)
        os.close(r)

    scenario(go)


HANDLER = (
    "import signal, sys\n"
    "def h(s, f):\n    sys.exit(9 if s == signal.SIGUSR1 else 1)\n"
    "signal.signal(signal.SIGUSR1, h)\n"
    "print('ready', flush=True)\n"
    "while True: signal.pause()\n"
)


def test_signals_from_the_claimer_reach_the_program() -> None:
    def go(launcher: Launcher) -> None:
        authorize(launcher, "t", [PYTHON, "-S", "-c", HANDLER])
        r, w = os.pipe()
        with open(os.devnull, "r+b") as null:
            c = Claimer(launcher)
            c.claim("t", {0: null.fileno(), 1: w, 2: null.fileno()})
        os.close(w)
        assert select.select([r], [], [], TIMEOUT)[0] and os.read(r, 100) == b"ready\n"
        c.signal(signal.SIGUSR1)
        assert c.answer() == ("exit", "9")
        os.close(r)

    scenario(go)


PGRP = "import os; print(os.getpid(), os.getpgrp())"


@pytest.mark.parametrize("new_session", [False, True], ids=["same-session", "own-session"])
def test_the_program_joins_the_claimers_process_group(new_session: bool) -> None:
    """So the terminal's signals reach it with its claimer. A group in another session (the
    launcher called setsid) cannot be joined: the program gets a group of its own."""

    def go(launcher: Launcher) -> None:
        authorize(launcher, "t", [PYTHON, "-S", "-c", PGRP])
        r, w = os.pipe()
        with open(os.devnull, "r+b") as null:
            c = Claimer(launcher)
            c.claim("t", {0: null.fileno(), 1: w, 2: null.fileno()})
        os.close(w)
        assert c.answer() == ("exit", "0")
        pid, group = map(int, until_eof(r).split())
        os.close(r)
        assert group == (pid if new_session else os.getpgrp())

    scenario(go, new_session=new_session)


PEER = r"""
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall(bytes.fromhex(sys.argv[2]))
    print("answer", repr(s.recv(100)))
except (BrokenPipeError, ConnectionResetError):  # closed before or after our claim came
    print("answer", repr(b""))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a claimer as another user")
def test_claims_from_another_user_are_refused() -> None:
    def go(launcher: Launcher) -> None:
        assert launcher.claim_path is not None
        authorize(launcher, "t", ["/bin/true"])
        # Make the socket reachable for the other user: only the peer check remains.
        launcher.claim_path.parent.chmod(0o755)
        launcher.claim_path.chmod(0o666)
        frame = claim_frame("t", [], [])
        theirs = subprocess.run(
            [PYTHON, "-S", "-c", PEER, str(launcher.claim_path), frame.hex()],
            user=65534,
            capture_output=True,
            timeout=TIMEOUT,
        )
        assert theirs.stdout == b"answer b''\n", theirs.stderr  # closed, no answer
        assert simple_claim(launcher, "t").answer() == ("exit", "0")  # the ticket is intact

    scenario(go)


def test_a_claim_waits_for_an_authorization_still_in_the_control_channel() -> None:
    """The server posts `authorize` and answers its client at once; the claim may be read
    first. The launcher reads what is pending on the control channel before refusing."""

    async def go() -> None:
        async with launcher_with_claims() as launcher:
            # Stop the launcher, queue many authorizations (the last one ours), then a claim
            # for it, and let the launcher go on: the claim is as early as it can ever be.
            os.kill(launcher.pid, signal.SIGSTOP)
            try:
                for i in range(50):
                    authorize(launcher, f"filler-{i}", ["/bin/true"])
                authorize(launcher, "ours", ["/bin/sh", "-c", "exit 5"])
                with open(os.devnull, "r+b") as null:
                    c = Claimer(launcher)
                    c.claim("ours", {0: null.fileno()})
            finally:
                os.kill(launcher.pid, signal.SIGCONT)
            assert await asyncio.to_thread(c.answer) == ("exit", "5")

    run(go)
