"""Benchmark the policy engine: load time (cold / warm) and decision latency (p50 / p99) of a
10,000-rule file, each against a 10-rule policy measured in the same run.

    .venv/bin/python bench/policy.py [--rules 10000] [--samples 20000]

Targets (issue #2): warm load < 100 ms, decision p50 <= 10 us on the large policy.

A program's index is built the first time a command for it is evaluated; the latencies are
measured with every program indexed (a long-lived server's steady state, or build_index()).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

WORDS = ["status", "diff", "log", "push", "build", "test", "run", "install", "-rf", "-x", "--all"]


def rules_text(count: int, seed: int = 1) -> str:
    """``count`` rules: many programs with a few rules each, plus some crowded programs."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        # One rule in ten goes to one of five busy programs (hundreds of rules each).
        program = f"busy{i % 5}" if i % 10 == 0 else f"prog{i // 4}"
        rest = [f"sub{i}"] + [rng.choice(WORDS) for _ in range(rng.randint(0, 2))]
        pattern = [program, *rest]
        if rng.random() < 0.3:
            pattern.append([rng.choice(WORDS), rng.choice(WORDS)])
        decision = rng.choice(["allow", "prompt", "forbidden"])
        justification = f', justification = "rule {i}"' if rng.random() < 0.5 else ""
        lines.append(
            f"prefix_rule(pattern = {pattern!r}, decision = {decision!r}{justification})".replace(
                "'", '"'
            )
        )
    return "\n".join(lines) + "\n"


def commands(count: int, seed: int = 2) -> list[list[str]]:
    rng = random.Random(seed)
    result = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.4:  # a program with rules, sometimes matching
            program = f"prog{rng.randrange(count)}" if count > 10 else "prog1"
            result.append([program, f"sub{rng.randrange(count)}", rng.choice(WORDS)])
        elif kind < 0.6:  # a crowded program
            result.append([f"busy{rng.randrange(5)}", f"sub{rng.randrange(0, count, 10)}", "x"])
        elif kind < 0.8:  # no rule at all
            result.append(["ls", "-la", "/tmp"])
        else:  # resolution of a path
            result.append([f"/usr/bin/prog{rng.randrange(100)}", f"sub{rng.randrange(400)}"])
    return result


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def latencies_us(policy: object, cmds: list[list[str]], resolve: bool) -> tuple[float, float]:
    evaluate = policy.evaluate  # type: ignore[attr-defined]
    for command in cmds[:1000]:  # warm up
        evaluate(command, resolve_host_executables=resolve)
    samples = []
    clock = time.perf_counter_ns
    for command in cmds:
        start = clock()
        evaluate(command, resolve_host_executables=resolve)
        samples.append(clock() - start)
    samples.sort()
    return samples[len(samples) // 2] / 1000, samples[int(len(samples) * 0.99)] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=20_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["EXECGATE_HOME"] = str(Path(tmp) / "home")
        from execgate.policy import load_rules_files
        from execgate.policy.cache import RulesCache

        big = Path(tmp) / "big.rules"
        small = Path(tmp) / "small.rules"
        big.write_text(rules_text(args.rules))
        small.write_text(rules_text(10))
        cache = RulesCache(Path(tmp) / "cache", min_bytes=0)
        sizes = {"big": big.stat().st_size, "small": small.stat().st_size}

        cold = {
            name: median_ms(lambda p=path: load_rules_files([p], cache=False), 3)
            for name, path in (("big", big), ("small", small))
        }
        for path in (big, small):
            load_rules_files([path], cache=cache)  # fill the cache
        warm = {
            name: median_ms(lambda p=path: load_rules_files([p], cache=cache), 5)
            for name, path in (("big", big), ("small", small))
        }
        policies = {
            name: load_rules_files([path], cache=cache).build_index()
            for name, path in (("big", big), ("small", small))
        }
        indexed = {
            name: median_ms(lambda p=path: load_rules_files([p], cache=cache).build_index(), 3)
            for name, path in (("big", big), ("small", small))
        }

    cmds = {"big": commands(args.samples), "small": commands(args.samples)}
    for row in (cmds["small"],):
        for command in row:  # make the small policy's commands hit its own programs
            if command[0].startswith("prog"):
                command[0] = "prog1"
    print(f"policy engine benchmark: {args.rules} rules ({sizes['big'] / 1e6:.1f} MB) vs 10 rules")
    print(f"{'':<34}{'10k rules':>12}{'10 rules':>12}{'ratio':>9}")

    def row(label: str, big_value: float, small_value: float, unit: str) -> None:
        ratio = big_value / small_value if small_value else float("inf")
        print(f"{label:<34}{big_value:>9.2f} {unit:<2}{small_value:>9.2f} {unit:<2}{ratio:>8.1f}x")

    row("load, cold (Starlark)", cold["big"], cold["small"], "ms")
    row("load, warm (cache)", warm["big"], warm["small"], "ms")
    row("load, warm + index every program", indexed["big"], indexed["small"], "ms")
    for resolve in (False, True):
        big_p50, big_p99 = latencies_us(policies["big"], cmds["big"], resolve)
        small_p50, small_p99 = latencies_us(policies["small"], cmds["small"], resolve)
        suffix = " +resolve" if resolve else ""
        row(f"decision p50{suffix}", big_p50, small_p50, "us")
        row(f"decision p99{suffix}", big_p99, small_p99, "us")
    verdicts = [
        ("warm load < 100 ms", warm["big"] < 100),
        ("decision p50 <= 10 us", latencies_us(policies["big"], cmds["big"], False)[0] <= 10),
    ]
    print("targets: " + ", ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in verdicts))


if __name__ == "__main__":
    main()
