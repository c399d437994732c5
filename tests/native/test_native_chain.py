"""The native front's decision-log writer (native/chain.c, native/sha256.c) against the
Python one (decisionlog/chain.py): the same SHA-256, the same bytes for the first record, one
chain when both write (also at once, also across rotation), and no hang or write elsewhere
when the log is not a regular file.

The first record is what the server of a native start wrote before the front did
(docs/protocol.md §8): decision ``run``, source ``none``, the server's pid, the front's."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execgate.decisionlog.argv import bounded_argv
from execgate.decisionlog.chain import ChainedFile, encode_line, log_files, verify

from .conftest import REPO

NATIVE = REPO / "native"
SESSION = "0123456789abcdef"
SANDBOX = "off (no confinement)"


@pytest.fixture(scope="module")
def chaintool(cprog: Any) -> Path:
    sources = [str(NATIVE / "chain.c"), str(NATIVE / "sha256.c")]
    path: Path = cprog("chaintool", "-D_GNU_SOURCE", f"-I{NATIVE}", *sources)
    return path


def python_record(
    time_us: int, pid: int, ppid: int, cwd: bytes, program: bytes, argv: list[bytes]
) -> dict[str, object]:
    """The first record as the server of a native start wrote it (execgate/adopt.py before
    the front wrote it): its texts as Python decodes them (os.fsdecode)."""
    words, cut = bounded_argv([os.fsdecode(word) for word in argv])
    record: dict[str, object] = {
        "time": round(time_us / 1_000_000, 6),
        "session": SESSION,
        "front": "run",
        "kind": "exec",
        "pid": pid,
        "ppid": ppid,
        "cwd": os.fsdecode(cwd),
        "program": os.fsdecode(program),
        "argv": words,
    }
    if cut:
        record["argv_cut"] = cut
    record.update(via="session", decision="run", sandbox=SANDBOX, source="none")
    return record


def record_args(
    time_us: int, pid: int, ppid: int, cwd: bytes, program: bytes, argv: list[bytes]
) -> list[str | bytes]:
    return [str(time_us), SESSION, str(pid), str(ppid), cwd, program, SANDBOX, "--", *argv]


def c_append(chaintool: Path, log: Path, max_bytes: int, keep: int, *record: Any) -> None:
    done = subprocess.run(
        [chaintool, "append", log, str(max_bytes), str(keep), "1", *record_args(*record)],
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr


# Words: any bytes but NUL (what execve carries), undecodable ones and characters above
# U+FFFF (JSON surrogate pairs) included, and control characters.
WORD = st.one_of(
    st.binary(max_size=24),
    st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass")),
).map(lambda b: b.replace(b"\0", b""))
TEXT = WORD.filter(bool)


def test_the_python_side_decodes_as_the_c_writer_does() -> None:
    # the server's texts are os.fsdecode'd; the front declines non-ASCII under other locales
    assert sys.getfilesystemencoding() == "utf-8"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300))
def test_sha256_is_hashlibs(chaintool: Path, data: bytes) -> None:
    done = subprocess.run([chaintool, "sha256"], input=data, capture_output=True, check=True)
    assert done.stdout.decode().strip() == hashlib.sha256(data).hexdigest()


def test_sha256_of_long_and_block_sized_inputs(chaintool: Path) -> None:
    rng = random.Random(14)
    for size in [0, 55, 56, 63, 64, 65, 119, 120, 128, 1000, 65536, 1 << 20]:
        data = rng.randbytes(size)
        done = subprocess.run([chaintool, "sha256"], input=data, capture_output=True, check=True)
        assert done.stdout.decode().strip() == hashlib.sha256(data).hexdigest(), size


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    time_us=st.integers(1_000_000_000 * 1_000_000, 8_500_000_000 * 1_000_000),  # (now: 1.7e9)
    pid=st.integers(1, 4_194_304),
    cwd=TEXT,
    program=TEXT,
    argv=st.lists(WORD, min_size=1, max_size=6),
)
def test_the_first_record_is_the_python_writers_line(
    chaintool: Path, time_us: int, pid: int, cwd: bytes, program: bytes, argv: list[bytes]
) -> None:
    prev = hashlib.sha256(b"before").hexdigest()
    record = (time_us, pid, pid + 1, b"/" + cwd, b"/" + program, argv)
    done = subprocess.run(
        [chaintool, "line", prev, *record_args(*record)], capture_output=True, check=True
    )
    assert done.stdout == encode_line(python_record(*record), prev)


def test_long_words_and_vectors_are_cut_as_python_cuts_them(chaintool: Path) -> None:
    """``bounded_argv``: a word is cut at 4096 characters (not bytes), and no word is kept
    once 65536 characters are."""
    long_words = [
        ["x" * 5000],
        ["é" * 4097, "\U0001f600" * 4100],
        [b"\xff" * 4200],
        ["y" * 4000] * 20,
        ["z" * 4096] * 16 + ["after"],
    ]
    for words in long_words:
        argv = [w if isinstance(w, bytes) else w.encode() for w in words]
        record = (1_764_569_080_123_456, 7, 8, b"/w", b"/usr/bin/prog", argv)
        done = subprocess.run(
            [chaintool, "line", "0" * 64, *record_args(*record)], capture_output=True, check=True
        )
        assert done.stdout == encode_line(python_record(*record), "0" * 64), words


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_mixed_writers_make_the_python_writers_files(chaintool: Path, tmp_path: Path) -> None:
    """The same appends, some by C and some by Python, into one log (a torn last line and
    rotation among them), give byte for byte the files Python alone gives, and one chain."""
    rng = random.Random(6)
    mixed, alone = tmp_path / "mixed" / "decisions.jsonl", tmp_path / "alone" / "decisions.jsonl"
    max_bytes, keep = 1600, 3
    python_writer = ChainedFile(mixed, max_bytes=max_bytes, keep=keep)
    try:
        for step in range(40):
            argv = [b"prog", rng.randbytes(rng.randrange(0, 60)).replace(b"\0", b"")]
            record = (1_764_569_080_000_000 + step * 1234, 100 + step, 99, b"/w", b"/bin/p", argv)
            if step == 17:  # a writer killed mid-line: its line stays one (broken) line
                for log in (mixed, alone):
                    with open(log, "ab") as f:
                        f.write(b'{"torn')
            if rng.random() < 0.5:
                c_append(chaintool, mixed, max_bytes, keep, *record)
            else:
                python_writer.append([python_record(*record)])
            fresh = ChainedFile(alone, max_bytes=max_bytes, keep=keep)
            fresh.append([python_record(*record)])
            fresh.close()
    finally:
        python_writer.close()
    assert len(log_files(mixed)) == keep + 1  # it did rotate
    assert _contents(mixed.parent) == _contents(alone.parent)


CONCURRENT_PYTHON = """
import sys
from pathlib import Path
from execgate.decisionlog.chain import ChainedFile
log = Path(sys.argv[1])
max_bytes, keep, count = map(int, sys.argv[2:5])
writer = ChainedFile(log, max_bytes=max_bytes, keep=keep)
for i in range(count):
    writer.append([{"kind": "python", "n": i}])
"""


def test_concurrent_c_and_python_writers_form_one_chain(chaintool: Path, tmp_path: Path) -> None:
    log = tmp_path / "log" / "decisions.jsonl"
    max_bytes, keep, count = 6000, 100, 40  # rotating often, keeping every file
    record = record_args(1_764_569_080_000_000, 5, 4, b"/w", b"/bin/p", [b"p", b"x" * 50])
    writers = [
        subprocess.Popen([chaintool, "append", log, str(max_bytes), str(keep), str(count), *record])
        for _ in range(3)
    ]
    writers += [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_PYTHON, log, str(max_bytes), str(keep), str(count)]
        )
        for _ in range(2)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0] * 5
    result = verify(log)
    assert result.broken is None, result
    assert result.lines == 5 * count and result.files > 1


@pytest.mark.parametrize("kind", ["fifo", "fifo behind a link", "folder", "device"])
def test_a_log_that_is_no_regular_file_is_refused_at_once(
    chaintool: Path, tmp_path: Path, kind: str
) -> None:
    """Neither writer waits on a FIFO (a reader that never comes would hang the front before
    the command ran) or writes into what is not a regular file."""
    log = tmp_path / "log" / "decisions.jsonl"
    log.parent.mkdir()
    if kind.startswith("fifo"):
        os.mkfifo(tmp_path / "fifo")
        if kind == "fifo":
            os.rename(tmp_path / "fifo", log)
        else:
            log.symlink_to(tmp_path / "fifo")
    elif kind == "folder":
        log.mkdir()
    else:
        log.symlink_to("/dev/null")
    record = record_args(1, 2, 3, b"/w", b"/bin/p", [b"p"])
    done = subprocess.run(
        [chaintool, "append", log, "100000", "2", "1", *record], capture_output=True, timeout=30
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"cannot write the decision log {log}: ".encode()), done.stderr
    from execgate.decisionlog.chain import LogPathError

    with pytest.raises(LogPathError):
        ChainedFile(log, max_bytes=100000, keep=2)
