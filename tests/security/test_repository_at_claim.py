"""A git repository made, or swapped in, after the server decided an escalation: performed for
real from inside a workspace-write session, as root and as the unprivileged user.

`prefix_rule(["git", "status"], "allow")` escalates `git status`, which runs the repository's
`core.fsmonitor`. The server refuses to escalate out of a repository the sandbox can write
(gate/gitrepo.py), but that look is at the decision; the launcher looks again at the claim,
through the claimer's root, and pins what git may use (native/gitrepo.h). Every attack here
tries to make an escalated git run a `core.fsmonitor` that writes a witness into a folder only
an unconfined process can write.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcpharness import payload, shell_args

SRC = str(Path(__file__).resolve().parents[2] / "src")

# A prepared repository whose core.fsmonitor leaves a witness outside; `staged.git` is its
# `.git`, `gitdir-only` a copy that is a repository folder by itself (core.worktree: `.`).
PREPARE = """
export GIT_CONFIG_NOSYSTEM=1 HOME={work}
git init -q prep && mv prep/.git staged.git && rmdir prep
printf '[core]\\n\\tfsmonitor = "touch {out}/{witness}; false"\\n' >> staged.git/config
cp -r staged.git gitdir-only
printf '[core]\\n\\tbare = false\\n\\tworktree = .\\n' >> gitdir-only/config
"""

# Speaks EG1 itself: asks for `git status` in CWD, does AFTER once the ticket is given, claims.
FORGED_CLAIM = r"""
import os, shutil, sys
sys.path.insert(0, os.getcwd())
from forge import ask, claim
cwd, after = sys.argv[1], sys.argv[2]
os.chdir(cwd)
git = os.open("/usr/bin/git", os.O_RDONLY)
answer = ask(b"/usr/bin/git", [git], [], [b"git", b"status"])
print("answer", answer[0].decode(), flush=True)
if answer[0] != b"escalate":
    sys.exit(0)
top = os.environ["WORK"]
if after == "rename":  # a repository renamed into the working directory
    os.rename(f"{top}/staged.git", ".git")
elif after == "gitfile":  # a .git file naming the prepared repository
    with open(".git", "w") as f:
        f.write(f"gitdir: {top}/staged.git\n")
elif after == "nested":  # a repository made in a parent folder of the working directory
    os.rename(f"{top}/staged.git", f"{top}/sub/.git")
elif after == "symlink":  # the working directory's path swapped for a link to a repository
    os.makedirs(f"{top}/elsewhere")
    os.rename(f"{top}/staged.git", f"{top}/elsewhere/.git")
    os.rename(f"{top}/sub", f"{top}/sub.old")
    os.symlink(f"{top}/elsewhere", f"{top}/sub")
elif after == "gitdir":  # the working directory itself made a repository folder
    for name in os.listdir(f"{top}/gitdir-only"):
        shutil.move(f"{top}/gitdir-only/{name}", name)
claim(answer[1])
"""

VARIANTS = {
    "rename": "sub",
    "gitfile": "sub",
    "nested": "sub/deep",
    "symlink": "sub",
    "gitdir": "sub",
}


def _prepare(attacker: Any, witness: str) -> str:
    from .test_redteam import FORGE

    attacker.write_rules('prefix_rule(["git", "status"], "allow")\n')
    (attacker.work / "forge.py").write_text(FORGE)
    (attacker.work / "claim.py").write_text(FORGED_CLAIM)
    attacker.give(attacker.work)
    return PREPARE.format(work=attacker.work, out=attacker.outside, witness=witness)


@pytest.mark.parametrize("after", sorted(VARIANTS))
def test_a_repository_swapped_in_after_the_decision_never_runs_outside(
    attacker: Any, after: str
) -> None:
    """Each way of putting a repository on git's way between the decision and the claim: the
    claim is refused (a `.git` the sandbox wrote, a working directory whose path became a
    link), or git is pinned to no repository (a working directory made a repository folder
    itself, which git discovers without any `.git`)."""
    script = _prepare(attacker, "raced") + (
        f"mkdir -p sub/deep && {sys.executable} claim.py {VARIANTS[after]} {after} 2>&1; "
        'echo "claimed $?"; echo still working\n'
    )
    done = attacker.run(
        script, mode="workspace-write", env={"PYTHONPATH": SRC, "WORK": str(attacker.work)}
    )
    text = done.stdout.decode()
    assert "still working" in text, (text, done.stderr)
    assert not (attacker.outside / "raced").exists(), (text, done.stderr)
    assert "answer escalate" in text, (text, done.stderr)
    if after == "gitdir":  # escalated, with GIT_DIR naming no repository
        assert "not a git repository" in text and "claimed 128" in text, text
    else:
        assert "execgate: not escalated" in text and "claimed 126" in text, text


def test_a_folder_made_a_repository_itself_is_not_escalated_from(attacker: Any) -> None:
    """No race, no forged request: the sandbox copies a repository's HEAD, objects, refs and a
    config naming `.` its work tree into a folder of the workspace and runs `git status`
    there. git takes the folder itself for the repository (no `.git` anywhere), and its
    core.fsmonitor ran outside (found on the merged main). The decision now runs it in place,
    and says why."""
    script = _prepare(attacker, "folder") + (
        "mkdir sub && cp -r gitdir-only/. sub/ && cd sub && git status >/dev/null 2>&1; "
        'echo "status $?"; echo still working\n'
    )
    done = attacker.run(
        script, mode="workspace-write", options=["--audit", str(attacker.work / "audit.jsonl")]
    )
    text = done.stdout.decode()
    assert "still working" in text, (text, done.stderr)
    assert not (attacker.outside / "folder").exists(), (text, done.stderr)
    log = (attacker.work / "audit.jsonl").read_text()
    assert "it would start in the git repository" in log, log


# Renames a prepared repository in and out of `sub/.git` as fast as it can while the session
# runs `git status` in `sub` over and over: in-process claims (bash's forked children), and
# claims through the wrapper (a Python process with a second thread).
RACE = """
( while [ ! -e stop ]; do mv staged.git sub/.git 2>/dev/null; mv sub/.git staged.git \\
    2>/dev/null; done ) &
( while [ ! -e stop ]; do mv gitdir-only/HEAD sub/HEAD 2>/dev/null; mv sub/HEAD \\
    gitdir-only/HEAD 2>/dev/null; done ) &
cp -r gitdir-only/objects gitdir-only/refs gitdir-only/config sub/
cd sub
for i in $(seq {attempts}); do git status >/dev/null 2>&1; echo "status $?"; done
{python} ../threaded.py {attempts}
cd .. && touch stop && wait && echo still working
"""

THREADED = r"""
import os, sys, threading
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1), os.dup2(fd, 2)
        os.execv("/usr/bin/git", ["git", "status"])  # two threads: claimed by the wrapper
    print("threaded status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def test_racing_a_repository_into_place_never_runs_outside(attacker: Any) -> None:
    """The rename races every step from the decision to git's own discovery, with a bounded
    number of attempts; it must never win. (Statuses vary with who wins each round: 0 or 128
    outside with the pin, 128 in place, 126 refused; none runs the fsmonitor outside.)"""
    attempts = 25
    script = _prepare(attacker, "raced") + "mkdir sub\n"
    (attacker.work / "threaded.py").write_text(THREADED)
    attacker.give(attacker.work)
    script += RACE.format(attempts=attempts, python=sys.executable)
    done = attacker.run(script, mode="workspace-write", timeout=240)
    text = done.stdout.decode()
    assert "still working" in text, (text, done.stderr)
    assert not (attacker.outside / "raced").exists(), (text, done.stderr)
    assert text.count("status ") == 2 * attempts, text


def test_an_escalation_below_a_protected_repository_uses_that_repository(attacker: Any) -> None:
    """The pin keeps what the user allowed working: `git status` from a subfolder of a
    workspace whose `.git` was there at the spawn (read-only inside) escalates and runs the
    user's own core.fsmonitor outside (GIT_DIR names that repository); in a folder that is no
    repository, git finds none, as before."""
    out = attacker.outside
    legit = attacker.base / "legit"
    (legit / "sub").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(legit)], check=True)
    subprocess.run(["git", "-C", str(legit), "config", "core.fsmonitor",
                    f"touch {out}/legit; false"], check=True)  # fmt: skip
    attacker.write_rules('prefix_rule(["git", "status"], "allow")\n')
    attacker.give(legit)
    script = f"""
        export GIT_CONFIG_NOSYSTEM=1 HOME={attacker.work}
        (cd {legit}/sub && git status --short >/dev/null); echo "sub status $?"
        git status >/dev/null 2>&1; echo "plain status $?"
        echo still working
    """
    done = attacker.run(script, mode="workspace-write", options=["--writable-root", str(legit)])
    text = done.stdout.decode()
    assert "still working" in text, (text, done.stderr)
    assert "sub status 0" in text and (out / "legit").exists(), (text, done.stderr)
    assert "plain status 128" in text, (text, done.stderr)


def test_a_repository_made_in_one_sandbox_is_not_trusted_in_the_next(attacker: Any) -> None:
    """`.git` in a writable root is read-only in every sandbox spawned after it exists — also
    when the session's own sandbox made it. The session's shell makes one with a
    core.fsmonitor and runs `git status`: in place (the shell's sandbox can write that
    `.git`), but git is rule-named, so in place is a confined claim: a fresh sandbox, where
    that `.git` is read-only. Its fsmonitor ran there and asked for `/usr/bin/git status`
    again, which was escalated and ran the fsmonitor outside (found on the merged main). The
    launcher now trusts a read-only `.git` in a folder the sandbox can write only if it was
    there when the session started."""
    out, work = attacker.outside, attacker.work
    attacker.write_rules('prefix_rule(["git", "status"], "allow")\n')
    hook = (
        f"touch {out}/second 2>/dev/null && exit 1; [ -e {work}/once ] && exit 1; "
        f"touch {work}/once; /usr/bin/git status >/dev/null 2>&1; false"
    )
    script = f"""
        export GIT_CONFIG_NOSYSTEM=1 HOME={work}
        git init -q prep && cp -r prep/.git .git
        printf '[core]\\n\\tfsmonitor = "{hook}"\\n' >> .git/config
        git status >/dev/null 2>&1; echo "status $?"; echo still working
    """
    done = attacker.run(script, mode="workspace-write", options=["--audit", str(work / "a.jsonl")])
    text = done.stdout.decode()
    assert "still working" in text, (text, done.stderr)
    assert (work / "once").exists(), text  # the fsmonitor ran in the fresh sandbox and asked
    assert not (out / "second").exists(), (text, done.stderr)
    # and the server said so when it decided (it knows the .git folders of the start too)
    decisions = [json.loads(line) for line in (work / "a.jsonl").read_text().splitlines()]
    statuses = [d for d in decisions if d.get("argv", [])[1:] == ["status"]]
    assert len(statuses) == 2 and all(d["decision"] == "run" for d in statuses), statuses
    assert all("it would start in the git repository" in d["reason"] for d in statuses), statuses


@pytest.mark.parametrize("world", ["root", "unprivileged"], indirect=True)
def test_mcp_a_repository_made_by_one_call_is_not_trusted_by_the_next(world: Any) -> None:
    """Each MCP call is a session of its own, whose sandbox sees the `.git` an earlier call
    made as read-only: call 1 makes one with a core.fsmonitor, call 2 runs an allowed
    `git status`."""
    m = world.mcp
    m.write_rules(m.rules.read_text() + 'prefix_rule(["git", "status"], "allow")\n')
    make = (
        f"export GIT_CONFIG_NOSYSTEM=1 HOME={m.work}; git init -q prep && cp -r prep/.git .git"
        f" && printf '[core]\\n\\tfsmonitor = \"touch {m.outside}/call; false\"\\n' >> .git/config"
        " && echo made"
    )
    status = f"export GIT_CONFIG_NOSYSTEM=1 HOME={m.work}; git status >/dev/null; echo status=$?"

    async def scenario() -> list[str]:
        outputs = []
        ws = ("--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir")
        async with world.client(*ws, "--workspace", str(m.work)) as client:
            for command in (make, status):
                result = await client.call_tool("shell", shell_args(m, command))
                outputs.append(str(payload(result)["output"]))
        return outputs

    outputs = asyncio.run(scenario())
    assert "made" in outputs[0] and "status=" in outputs[1], outputs
    assert not (m.outside / "call").exists(), outputs
