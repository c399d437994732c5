"""The chained log file itself: concurrent writer processes, rotation, tampering."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from execgate.decisionlog.chain import ChainedFile, log_files, read_lines, verify
from execgate.decisionlog.recorder import DecisionLog

WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from execgate.decisionlog.chain import ChainedFile
    path, me, batches = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    log = ChainedFile(path, max_bytes=int(sys.argv[4]), keep=1000)
    sys.stdin.read()  # every writer starts at once
    for i in range(batches):
        log.append([{"writer": me, "n": i, "argv": ["x" * (i % 7)]}, {"writer": me, "n": -i}])
    """
)


def test_sixteen_writer_processes_keep_one_chain_across_rotation(tmp_path: Path) -> None:
    path = tmp_path / "log" / "decisions.jsonl"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), f"w{k}", "40", "8192"],
            stdin=subprocess.PIPE,
        )
        for k in range(16)
    ]
    for writer in writers:  # release them together
        assert writer.stdin is not None
        writer.stdin.close()
    assert [w.wait(timeout=120) for w in writers] == [0] * 16
    result = verify(path)
    assert result.broken is None
    assert result.lines == 16 * 40 * 2
    assert result.files > 2  # it rotated, and the chain ran on across the files
    seen = {(r["writer"], r["n"]) for r in (line.record for line in read_lines(path)) if r}
    assert len(seen) == 16 * 40 * 2 - 16  # n = 0 twice per writer


def test_a_changed_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    log = ChainedFile(path)
    log.append([{"decision": "deny", "n": n} for n in range(10)])
    lines = path.read_bytes().splitlines()
    lines[4] = lines[4].replace(b'"deny"', b'"run"')
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = verify(path)
    assert result.broken is not None
    assert result.broken.startswith(f"{path}:6: does not follow the line before it ({path}:5)")


def test_a_removed_line_and_garbage_are_named(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    ChainedFile(path).append([{"n": n} for n in range(5)])
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join(lines[:2] + lines[3:]) + b"\n")
    assert (verify(path).broken or "").startswith(f"{path}:3: does not follow")
    path.write_bytes(b"\n".join([*lines[:3], b"not json", *lines[3:]]) + b"\n")
    assert (verify(path).broken or "").startswith(f"{path}:4: not a JSON object")


def test_rotation_is_bounded_and_a_new_writer_continues_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    first = ChainedFile(path, max_bytes=4096, keep=2)
    for n in range(200):
        first.append([{"n": n, "pad": "y" * 100}])
    second = ChainedFile(path, max_bytes=4096, keep=2)  # another process, later
    second.append([{"n": "later"}])
    first.append([{"n": "first again"}])  # its cached tail is stale: it reads the file
    assert len(log_files(path)) == 3
    assert sum(f.stat().st_size for f in log_files(path)) <= 3 * 4096
    result = verify(path)
    assert result.broken is None, result.broken
    last = [json.loads(raw) for raw in path.read_bytes().splitlines()][-2:]
    assert [r["n"] for r in last] == ["later", "first again"]


def test_a_torn_last_line_stays_one_broken_line(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    ChainedFile(path).append([{"n": 1}])
    with path.open("ab") as f:
        f.write(b'{"n": 2, "pre')  # a writer killed mid-write
    ChainedFile(path).append([{"n": 3}])
    assert (verify(path).broken or "").startswith(f"{path}:2: not a JSON object")
    assert json.loads(path.read_bytes().splitlines()[2])["n"] == 3


def test_records_are_written_when_the_log_closes_and_non_utf8_survives(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    log = DecisionLog("run", chain=ChainedFile(path))
    log.record(lambda: {"argv": ["printf", "\udcff"]})  # no event loop: written at once
    log.close()
    [line] = list(read_lines(path))
    assert line.record is not None
    assert line.record["argv"] == ["printf", "\udcff"]
    assert line.record["front"] == "run" and line.record["session"] == log.session


def test_a_permission_request_is_one_more_kind_of_record(tmp_path: Path) -> None:
    from execgate.decisionlog.query import render
    from execgate.decisionlog.recorder import permission_entry

    path = tmp_path / "decisions.jsonl"
    log = DecisionLog("mcp", chain=ChainedFile(path))
    log.record(
        permission_entry(
            call=3,
            permission="network",
            detail={"host": "example.com", "port": 443},
            decision="allow",
            source="elicitation",
            answer="once",
            answered_by="elicitation",
        )
    )
    log.close()
    [line] = list(read_lines(path))
    assert line.record is not None and line.record["kind"] == "permission"
    shown = render(line.record, colour=False)
    assert 'permission network {"host":"example.com","port":443}' in shown
    assert "[once by elicitation]" in shown and f"mcp:{log.session[:8]}.3" in shown
    assert verify(path).broken is None
