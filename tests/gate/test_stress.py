"""Many processes exec at once: every one gets the right answer, none is lost, nothing leaks."""

from __future__ import annotations

from .conftest import Gate

WORKERS = 16
EXECS_PER_WORKER = 600  # 9 600 execs in all, 16 at once: enough to interleave every kind

# i % 10 -> (command, expected exit status, what it exercises)
#   0-3  /bin/true            0    no rule names it: decided in the process (snapshot)
#   4-6  other run            0    named by a rule that does not match: a round trip, "run"
#   7-8  marker               126  forbidden: denied
#   9    other esc            0    allowed: escalated out of the sandbox and back
WORKER = r"""
fails=0; others=0
for ((i = 0; i < N; i++)); do
  case $((i % 10)) in
    0|1|2|3) /bin/true; rc=$?; want=0 ;;
    4|5|6) other run >/dev/null; rc=$?; want=0; others=$((others + 1)) ;;
    7|8) marker 2>/dev/null; rc=$?; want=126 ;;
    9) other esc >/dev/null; rc=$?; want=0; others=$((others + 1)) ;;
  esac
  [ $rc = $want ] || { fails=$((fails + 1)); echo "wrong: i=$i rc=$rc want=$want" >&2; }
done
echo "worker fails=$fails others=$others"
"""

SCRIPT = r"""
server=$(cut -d' ' -f4 /proc/$PPID/stat)   # bash <- launcher <- execgate
fds() { ls /proc/$1/fd | wc -l; }
before="$(fds $server) $(fds $PPID)"
for w in $(seq WORKERS); do bash -c "$WORKER" & done
wait
# The launcher closes the last answered claim's connection within 20 ms (launch.c
# close_lingering): wait for that, not for a leak (the test then fails, 10 s later).
for i in $(seq 200); do [ "$(fds $PPID)" = "${before#* }" ] && break; sleep 0.05; done
after="$(fds $server) $(fds $PPID)"
echo "fds before=$before after=$after"
"""


def test_parallel_execs_with_mixed_decisions(gate: Gate) -> None:
    gate.write_rules(
        'prefix_rule(["marker"], "forbidden")\n'
        'prefix_rule(["other", "esc"], "allow")\n'
        'prefix_rule(["other", "never-used"], "prompt")\n'  # makes `other` a named program
    )
    script = SCRIPT.replace("WORKERS", str(WORKERS))
    result = gate.run(
        script,
        options=["--sandbox", "workspace-write"],
        env={"WORKER": WORKER, "N": str(EXECS_PER_WORKER)},
        timeout=1200,
    )
    out = result.stdout.decode()
    err = result.stderr.decode()
    assert result.returncode == 0, err[-2000:]
    workers = [line for line in out.splitlines() if line.startswith("worker")]
    assert len(workers) == WORKERS, out
    expected_others = EXECS_PER_WORKER * 4 // 10
    assert all(line == f"worker fails=0 others={expected_others}" for line in workers), err[-3000:]
    # every run of `other` really ran (the marker binary logs one line per run)
    runs = (gate.traces / "ran-other").read_text().splitlines()
    assert len(runs) == WORKERS * expected_others
    assert not gate.ran("marker")
    # neither the server nor the launcher holds more descriptors than before
    (fds_line,) = [line for line in out.splitlines() if line.startswith("fds")]
    before, after = fds_line.removeprefix("fds before=").split(" after=")
    assert before == after, fds_line
