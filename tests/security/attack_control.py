"""Run inside a gated session: try every way to reach an `execgate mcp` approvals control
socket, list the pending questions and answer them `always`; print what happened as JSON.

usage: attack_control.py CONTROL_DIR GO_FILE DONE_FILE

Waits (bounded) for GO_FILE (the test creates it once a question is pending), attacks, then
creates DONE_FILE. Also attacks from a grandchild that left the session's process tree
(double fork + setsid).
"""

import contextlib
import glob
import json
import os
import socket
import sys
import time

control, go, done = sys.argv[1:4]
home = os.environ.get("EXECGATE_HOME", "")


def talk(path: str, message: dict) -> object:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        sock.connect(path)
        # The server may have replied and hung up first: then read what it said.
        with contextlib.suppress(BrokenPipeError):
            sock.sendall(json.dumps(message).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return json.loads(data) if data else "closed"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    except ValueError:
        return "garbage"
    finally:
        sock.close()


def candidates() -> set[str]:
    found: set[str] = set()
    # 1. the discovery files (where they are now, and where they used to be)
    for pattern in (f"{control}/mcp-*.json", f"{home}/run/mcp-*.json", f"{home}/*/mcp-*.json"):
        for name in glob.glob(pattern):
            try:
                with open(name) as handle:
                    found.add(json.load(handle)["socket"])
            except (OSError, ValueError, KeyError):
                pass
    # 2. by name, and by scanning every socket the kernel lists
    found.update(glob.glob(f"{control}/*.sock"))
    try:
        with open("/proc/net/unix") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 8 and parts[-1].startswith("/"):
                    found.add(parts[-1])
    except OSError:
        pass
    # 3. through other processes' view of the filesystem
    via_proc = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            for path in found:
                via_proc.add(f"/proc/{pid}/root{path}")
    # Only this test's own server: other servers on the machine belong to other people.
    return {p for p in found | via_proc if ours(p)}


def ours(path: str) -> bool:
    if path.startswith("/proc/"):
        path = "/" + path.split("/", 4)[4] if path.count("/") >= 4 else path
    return path.startswith((control + "/", home + "/"))


def attack(who: str) -> dict:
    report: dict = {"who": who, "listed": [], "answered": [], "errors": {}}
    paths = candidates()
    report["candidates"] = len(paths)
    for path in sorted(paths):
        reply = talk(path, {"op": "list"})
        if isinstance(reply, dict) and reply.get("ok"):
            report["listed"].append(path)
            for question in reply.get("pending", []):
                answer = {"op": "answer", "id": question["id"], "answer": "always"}
                result = talk(path, answer)
                if isinstance(result, dict) and result.get("ok"):
                    report["answered"].append(question["id"])
                else:
                    report["errors"][path] = str(result)
        elif "mcp-" in path and "/proc/" not in path:
            report["errors"][path] = str(reply)
    return report


deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)

reports = [attack("process")]
# A grandchild that leaves the session's process tree (and its process session).
read_end, write_end = os.pipe()
if os.fork() == 0:
    os.setsid()
    middle = os.getpid()
    if os.fork() == 0:
        os.close(read_end)
        while os.getppid() == middle and time.monotonic() < deadline:
            time.sleep(0.01)  # until reparented
        os.write(write_end, json.dumps(attack("orphan")).encode())
        os._exit(0)
    os._exit(0)
os.close(write_end)
data = b""
while chunk := os.read(read_end, 65536):
    data += chunk
if data:
    reports.append(json.loads(data))
print("ATTACK " + json.dumps(reports))
open(done, "w").close()
