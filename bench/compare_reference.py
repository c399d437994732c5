"""execgate against the reference (Codex's shell-tool MCP server 0.97), measured in one run.

Installs ``@openai/codex-shell-tool-mcp@0.97.0`` with npm into a cache folder when it is not
there yet (and, for the reference's workspace-write figures, ``@openai/codex@0.97.0``, whose
``codex`` is its ``codex-linux-sandbox``); without npm it says so and exits 0. Both servers are
driven by the same small JSON-RPC client over stdio, interleaved call by call, each started
with a ``codex/sandbox-state/update`` request before its first call. Every figure is a median;
the table prints execgate ÷ reference (the issue's table). The machine is shared: run it a
few times and read the spread, not one number.

    python bench/compare_reference.py [--calls 40] [--rounds 5] [--execs 300] [--no-build]
                                      [--round-trips-only]

Figures:
  round trips       ``shell`` ``true`` (a builtin: the fixed cost of a call), login and not,
                    no sandbox and workspace-write, back to back; and non-login again with
                    15 ms of quiet before each call (what execgate does after its answer does
                    not land in the reference's call then, and the CPUs have gone idle)
  start-up          spawn to the ``initialize`` answer (execgate also with 10 000 rules, warm)
  per exec          a loop of ``/bin/true`` timed inside the shell, as a ratio to plain bash:
                    no rule matches, and every exec escalated by an allow rule
  execgate run      ``execgate run -- bash -c true`` start to exit (the reference has none)
  build             ``bench/build_overhead.py``'s whole-build ratio (execgate only)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from build_overhead import execgate_command  # a sibling script (bench/ is sys.path[0])

REFERENCE = "@openai/codex-shell-tool-mcp@0.97.0"
REFERENCE_SANDBOX = "@openai/codex@0.97.0"
ARCH = "x86_64-unknown-linux-musl"
LOOP = (
    "i=0; s=$EPOCHREALTIME; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done; "
    "e=$EPOCHREALTIME; echo $(( (${{e/./}} - ${{s/./}}) / {n} ))"
)
ALLOW_TRUE = 'prefix_rule(pattern = ["true"], decision = "allow")\n'
NO_MATCH = 'prefix_rule(pattern = ["git", "push"], decision = "prompt")\n'


# -- the reference, installed on demand ----------------------------------------------------


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "execgate-bench"


def npm_install(package: str, prefix: Path) -> bool:
    prefix.mkdir(parents=True, exist_ok=True)
    npm = shutil.which("npm")
    if npm is None:
        return False
    print(f"installing {package} into {prefix} ...", file=sys.stderr)
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), package],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        print(f"npm install {package} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
    return done.returncode == 0


@dataclass(frozen=True)
class Reference:
    server: Path
    wrapper: Path
    bash: Path
    sandbox: Path | None  # codex-linux-sandbox, for workspace-write (None: not available)


def _bash_variants() -> list[str]:
    """The package's bash builds, best match for this system first (as its launcher picks)."""
    release: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            key, _, value = line.partition("=")
            release[key] = value.strip('"')
    ids = [release.get("ID", ""), *release.get("ID_LIKE", "").split()]
    version = release.get("VERSION_ID", "")
    ordered = [f"{i}-{version}" for i in ids if i] + [f"{i}-{version.split('.')[0]}" for i in ids]
    return [*ordered, "debian-12", "debian-11", "ubuntu-22.04", "centos-9", "ubuntu-24.04"]


def find_reference(install: bool) -> Reference | None:
    root = cache_dir() / "shell-tool-mcp-0.97.0"
    package = root / "node_modules/@openai/codex-shell-tool-mcp/vendor" / ARCH
    if not (package / "codex-exec-mcp-server").exists() and not (
        install and npm_install(REFERENCE, root)
    ):
        return None
    bash = None
    for variant in _bash_variants():
        candidate = package / "bash" / variant / "bash"
        if (
            candidate.exists()
            and subprocess.run([candidate, "-c", "true"], capture_output=True).returncode == 0
        ):
            bash = candidate
            break
    if bash is None:
        return None
    return Reference(
        server=package / "codex-exec-mcp-server",
        wrapper=package / "codex-execve-wrapper",
        bash=bash,
        sandbox=find_reference_sandbox(install),
    )


def find_reference_sandbox(install: bool) -> Path | None:
    """The 0.97 ``codex`` binary linked as ``codex-linux-sandbox`` (it dispatches on argv[0])."""
    root = cache_dir() / "codex-0.97.0"
    link = root / "codex-linux-sandbox"
    if link.exists():
        return link

    def installed() -> list[Path]:
        return [
            p
            for p in (root / "node_modules").rglob("codex")
            if p.is_file() and os.access(p, os.X_OK) and ARCH in str(p)
        ]

    found = installed()
    if not found and install and npm_install(REFERENCE_SANDBOX, root):
        found = installed()
    if not found:
        return None
    link.symlink_to(found[0])
    return link


# -- one JSON-RPC client for both servers --------------------------------------------------


class McpClient:
    """Newline-delimited JSON-RPC over a server's stdin/stdout: just enough MCP to call
    ``shell`` (the same code paths for both servers, so client cost cancels out)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._next = 0

    @classmethod
    async def start(cls, argv: list[str], env: dict[str, str], cwd: Path) -> McpClient:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            cwd=cwd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=1 << 24,
        )
        return cls(proc)

    async def request(self, method: str, params: dict[str, object]) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._next += 1
        ident = self._next
        message = {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{method}: the server closed its output")
            answer = json.loads(line)
            if answer.get("id") == ident and "method" not in answer:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                result: dict[str, object] = answer["result"]
                return result
            if "method" in answer and "id" in answer:  # a request to us (elicitation): no
                error = {"code": -32601, "message": "not supported"}
                refusal = {"jsonrpc": "2.0", "id": answer["id"], "error": error}
                self.proc.stdin.write(json.dumps(refusal).encode() + b"\n")

    async def notify(self, method: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}).encode() + b"\n")

    async def initialize(self) -> None:
        await self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "execgate-bench", "version": "1"},
            },
        )
        await self.notify("notifications/initialized")

    async def shell(self, command: str, workdir: Path, login: bool) -> str:
        arguments = {
            "command": command,
            "workdir": str(workdir),
            "login": login,
            "timeout_ms": 600_000,  # a loaded machine: a loop must not hit a default limit
        }
        result = await self.request("tools/call", {"name": "shell", "arguments": arguments})
        texts = [c.get("text", "") for c in result.get("content", []) if isinstance(c, dict)]
        if result.get("isError"):
            raise RuntimeError(f"shell {command!r} failed: {texts}")
        outputs = []
        for text in texts:  # the reference wraps its output in a JSON text
            with contextlib.suppress(ValueError):
                decoded = json.loads(text)
                if isinstance(decoded, dict) and "output" in decoded:
                    text = str(decoded["output"])
            outputs.append(text)
        return "\n".join(outputs)

    async def aclose(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 5)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


# -- the two servers -----------------------------------------------------------------------


@dataclass
class Place:
    """Isolated homes and a workspace for one run."""

    root: Path
    work: Path = field(init=False)
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.work = self.root / "work"
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(self.root / "home"),
            "EXECGATE_HOME": str(self.root / "execgate-home"),
            "EXECGATE_SYSTEM_DIR": str(self.root / "etc-execgate"),
            "EXECGATE_CODEX_SYSTEM_DIR": str(self.root / "etc-codex"),
            "CODEX_HOME": str(self.root / "codex-home"),
        }
        for folder in (self.work, *(Path(self.env[k]) for k in ("HOME", "EXECGATE_HOME"))):
            folder.mkdir(parents=True, exist_ok=True)
        (Path(self.env["CODEX_HOME"]) / "rules").mkdir(parents=True, exist_ok=True)

    def rules_file(self, name: str, text: str) -> Path:
        path = self.root / f"{name}.rules"
        path.write_text(text)
        return path


def sandbox_state(mode: str, place: Place, sandbox_exe: Path | None) -> dict[str, object]:
    if mode == "off":
        return {"sandboxPolicy": {"type": "danger-full-access"}, "sandboxCwd": str(place.work)}
    state: dict[str, object] = {
        "sandboxPolicy": {
            "type": "workspace-write",
            "writable_roots": [],
            "network_access": False,
            "exclude_tmpdir_env_var": False,
            "exclude_slash_tmp": False,
        },
        "sandboxCwd": str(place.work),
    }
    if sandbox_exe is not None:
        state["codexLinuxSandboxExe"] = str(sandbox_exe)
    return state


@dataclass
class Server:
    """How to start one server in one configuration."""

    name: str
    argv: list[str]
    env: dict[str, str]
    state: dict[str, object]

    async def start(self, cwd: Path) -> McpClient:
        client = await McpClient.start(self.argv, self.env, cwd)
        await client.initialize()
        with contextlib.suppress(RuntimeError):  # execgate takes it too; neither may widen
            await client.request("codex/sandbox-state/update", self.state)
        return client


def execgate_server(place: Place, mode: str, rules: Path) -> Server:
    argv = [sys.executable, "-m", "execgate", "mcp", "-q", "--rules", str(rules)]
    argv += ["--sandbox", mode]
    return Server("execgate", argv, place.env, sandbox_state(mode, place, None))


def reference_server(place: Place, ref: Reference, mode: str, rules: str) -> Server:
    (Path(place.env["CODEX_HOME"]) / "rules" / "bench.rules").write_text(rules)
    argv = [str(ref.server), "--execve", str(ref.wrapper), "--bash", str(ref.bash)]
    return Server("reference", argv, place.env, sandbox_state(mode, place, ref.sandbox))


# -- measuring ------------------------------------------------------------------------------


#: The quiet before each call of the extra rows: what a server does after its answer
#: (execgate opens the next spare session and starts its shell, ~2 ms of CPU) then cannot land
#: in the other server's call, as it can in back-to-back calls; idle CPUs wake slower, too.
QUIET = 0.015


async def round_trips(
    servers: list[Server], place: Place, calls: int, login: bool, settle: float = 0.0
) -> dict[str, float]:
    """Median seconds per ``shell true`` call, the servers' calls interleaved, each after
    ``settle`` seconds of quiet."""
    clients = [await s.start(place.work) for s in servers]
    samples: dict[str, list[float]] = {s.name: [] for s in servers}
    try:
        for client in clients:  # warm: the first call pays for what later calls reuse
            await client.shell("true", place.work, login)
        for _ in range(calls):
            for server, client in zip(servers, clients, strict=True):
                if settle:
                    await asyncio.sleep(settle)
                started = time.perf_counter()
                await client.shell("true", place.work, login)
                samples[server.name].append(time.perf_counter() - started)
    finally:
        for client in clients:
            await client.aclose()
    return {name: statistics.median(values) for name, values in samples.items()}


async def start_ups(servers: list[Server], place: Place, rounds: int) -> dict[str, float]:
    """Median seconds from spawning a server to its ``initialize`` answer."""
    samples: dict[str, list[float]] = {s.name: [] for s in servers}
    for server in servers:  # warm the caches (compiled policy, page cache)
        client = await McpClient.start(server.argv, server.env, place.work)
        await client.initialize()
        await client.aclose()
    for _ in range(rounds):
        for server in servers:
            started = time.perf_counter()
            client = await McpClient.start(server.argv, server.env, place.work)
            await client.initialize()
            samples[server.name].append(time.perf_counter() - started)
            await client.aclose()
    return {name: statistics.median(values) for name, values in samples.items()}


def plain_per_exec(place: Place, execs: int) -> int:
    loop = ["bash", "--norc", "--noprofile", "-c", LOOP.format(n=execs)]
    out = subprocess.run(loop, env=place.env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


async def per_exec(
    servers: list[Server], place: Place, rounds: int, execs: int
) -> dict[str, float]:
    """Median ratio of a gated exec to a plain one (µs per exec inside the shell, each
    sample against plain bash timed right before it)."""
    clients = [await s.start(place.work) for s in servers]
    ratios: dict[str, list[float]] = {s.name: [] for s in servers}
    command = LOOP.format(n=execs)
    try:
        for client in clients:
            await client.shell(LOOP.format(n=20), place.work, False)
        for _ in range(rounds):
            for server, client in zip(servers, clients, strict=True):
                plain = plain_per_exec(place, execs)
                text = await client.shell(command, place.work, False)
                numbers = re.findall(r"^\s*(\d+)\s*$", text, re.MULTILINE)
                if not numbers:
                    raise RuntimeError(f"{server.name}: no timing in {text[:300]!r}")
                ratios[server.name].append(int(numbers[-1]) / plain)
    finally:
        for client in clients:
            await client.aclose()
    return {name: statistics.median(values) for name, values in ratios.items()}


def run_start_to_exit(place: Place, rounds: int, rules: Path) -> tuple[float, float]:
    """Median seconds of ``execgate run -- bash -c true`` and of plain ``bash -c true``."""
    gated = [*execgate_command(), "run", "--rules", str(rules)]
    gated += ["--", "bash", "-c", "true"]
    plain = ["bash", "-c", "true"]
    samples: dict[str, list[float]] = {"gated": [], "plain": []}
    subprocess.run(gated, env=place.env, check=True)  # warm
    for _ in range(rounds):
        for name, argv in (("gated", gated), ("plain", plain)):
            started = time.perf_counter()
            subprocess.run(argv, env=place.env, check=True, cwd=place.work)
            samples[name].append(time.perf_counter() - started)
    return statistics.median(samples["gated"]), statistics.median(samples["plain"])


def many_rules(count: int) -> str:
    lines = [
        f'prefix_rule(pattern = ["prog{i}", "sub{i % 7}"], decision = "prompt")'
        for i in range(count)
    ]
    return "\n".join(lines) + "\n"


# -- the table ------------------------------------------------------------------------------


@dataclass
class Row:
    figure: str
    reference: str
    execgate: str
    quotient: str
    goal: str


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f} ms"


def ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def quotient(ours: float | None, theirs: float | None) -> str:
    return "n/a" if ours is None or theirs is None else f"{ours / theirs:.2f}"


def print_table(rows: list[Row]) -> None:
    names = list(Row.__dataclass_fields__)
    widths = [max(len(getattr(r, f)) for r in rows) for f in names]
    for row in rows:
        cells = [getattr(row, f).ljust(w) for f, w in zip(names, widths, strict=True)]
        print("| " + " | ".join(cells) + " |")
        if row is rows[0]:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


async def measure(args: argparse.Namespace, ref: Reference | None) -> list[Row]:
    rows = [Row("figure", "reference 0.97", "execgate", "execgate ÷ ref", "goal")]

    def show(row: Row) -> None:  # as it comes: a long run shows its progress
        rows.append(row)
        print(f"  {row.figure}: reference {row.reference}, execgate {row.execgate}", flush=True)

    with tempfile.TemporaryDirectory(prefix="eg-compare-") as tmp:
        place = Place(Path(tmp))
        no_match = place.rules_file("nomatch", NO_MATCH)

        def pair(mode: str, rules_text: str, rules: Path) -> list[Server]:
            ours = [execgate_server(place, mode, rules)]
            if ref is None or (mode != "off" and ref.sandbox is None):
                return ours
            return [*ours, reference_server(place, ref, mode, rules_text)]

        for label, mode, login in (
            ("`shell` round trip, `true`, non-login, no sandbox", "off", False),
            ("`shell` round trip, `true`, non-login, workspace-write", "workspace-write", False),
            ("`shell` round trip, `true`, login, no sandbox", "off", True),
            ("`shell` round trip, `true`, login, workspace-write", "workspace-write", True),
        ):
            got = await round_trips(pair(mode, NO_MATCH, no_match), place, args.calls, login)
            ours, theirs = got["execgate"], got.get("reference")
            show(Row(label, ms(theirs), ms(ours), quotient(ours, theirs), "≤ reference"))
        quiet = f"{QUIET * 1000:.0f} ms"
        for label, mode in (
            (f"… non-login, no sandbox, each call after {quiet} of quiet", "off"),
            (f"… non-login, workspace-write, each after {quiet} of quiet", "workspace-write"),
        ):
            pairs = pair(mode, NO_MATCH, no_match)
            got = await round_trips(pairs, place, args.calls, False, settle=QUIET)
            ours, theirs = got["execgate"], got.get("reference")
            show(Row(label, ms(theirs), ms(ours), quotient(ours, theirs), "≤ reference"))
        if args.round_trips_only:
            return rows

        got = await start_ups(pair("off", NO_MATCH, no_match), place, args.rounds * 2)
        ours, theirs = got["execgate"], got.get("reference")
        show(
            Row("server start to first answer", ms(theirs), ms(ours), quotient(ours, theirs),
                "≤ 150 ms")
        )  # fmt: skip
        big_text = many_rules(10_000)
        big = place.rules_file("big", big_text)
        got = await start_ups(pair("off", big_text, big), place, args.rounds * 2)
        ours, theirs = got["execgate"], got.get("reference")
        show(
            Row("… with 10 000 rules (warm)", ms(theirs), ms(ours), quotient(ours, theirs),
                "≤ 250 ms")
        )  # fmt: skip

        allow = place.rules_file("allow", ALLOW_TRUE)
        for label, mode, text, rules, goal in (
            ("per exec, no rule matches (÷ plain bash)", "off", NO_MATCH, no_match, "≤ 1.10x"),
            ("per exec, no rule matches, workspace-write", "workspace-write", NO_MATCH,
             no_match, "≤ 1.10x"),
            ("per exec, escalated, no sandbox (÷ plain bash)", "off", ALLOW_TRUE, allow, "—"),
            ("per exec, escalated, workspace-write", "workspace-write", ALLOW_TRUE, allow,
             "≤ 1.5x"),
        ):  # fmt: skip
            try:
                got = await per_exec(pair(mode, text, rules), place, args.rounds, args.execs)
            except RuntimeError as exc:  # say so, and go on with the other figures
                print(f"  {label}: failed: {exc}", file=sys.stderr)
                got = {}
            ours, theirs = got.get("execgate"), got.get("reference")
            show(Row(label, ratio(theirs), ratio(ours), quotient(ours, theirs), goal))

        gated, plain = run_start_to_exit(place, args.rounds * 4, no_match)
        show(
            Row("`execgate run -- bash -c true`, start to exit", f"(plain bash {ms(plain)})",
                ms(gated), "—", "≤ 50 ms")
        )  # fmt: skip
    if args.build:
        here = Path(__file__).resolve().parent
        sys.path.insert(0, str(here))
        import build_overhead

        for mode in ("off", "workspace-write"):
            got_ratio = build_overhead.measure_ratio(mode, rounds=args.build_rounds)
            show(
                Row(f"`make` of 31 C files ÷ plain, sandbox {mode}", "—", ratio(got_ratio),
                    "—", "≤ 1.05x")
            )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="round trips per figure")
    parser.add_argument("--rounds", type=int, default=5, help="samples of the other figures")
    parser.add_argument("--execs", type=int, default=300, help="execs per per-exec sample")
    parser.add_argument("--no-install", action="store_true", help="never run npm")
    parser.add_argument("--no-build", dest="build", action="store_false")
    parser.add_argument("--build-rounds", type=int, default=7)
    parser.add_argument("--round-trips-only", action="store_true", help="only the round trips")
    args = parser.parse_args()
    if shutil.which("npm") is None and not (cache_dir() / "shell-tool-mcp-0.97.0").exists():
        print("compare_reference: skipped: npm is not installed (the reference comes from npm)")
        return
    ref = find_reference(install=not args.no_install)
    if ref is None:
        print("compare_reference: skipped: the reference server could not be installed")
        return
    if ref.sandbox is None:
        print("note: no codex-linux-sandbox: the reference's workspace-write figures are n/a")
    rows = asyncio.run(measure(args, ref))
    load = os.getloadavg()[0]
    print(
        f"execgate vs {REFERENCE} ({ref.bash.parent.name} bash), {os.cpu_count()} cpus, "
        f"load {load:.2f}; medians, interleaved; {args.calls} calls per round trip"
    )
    print_table(rows)


if __name__ == "__main__":
    main()
