"""``execgate rules list|test|explain|init`` and ``execgate trust|untrust [DIR]``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from execgate import paths
from execgate.cli.check import command_tokens
from execgate.config import load_config
from execgate.errors import ExecgateError
from execgate.files import make_private_dir, write_atomically
from execgate.policy import (
    Decision,
    Evaluation,
    LoadedPolicy,
    Policy,
    PolicyError,
    PrefixRule,
    is_trusted,
    load_layered_policy,
    project_root,
    trust_project,
    trusted_projects,
    untrust_project,
)
from execgate.policy.cache import RulesCache
from execgate.policy.codex_text import render_command
from execgate.policy.language import FileRules, PolicyBuilder
from execgate.policy.layers import (
    default_rules_path,
    default_rules_text,
    project_dirs,
    rules_files_in,
    rules_folders,
)
from execgate.policy.loader import compile_rules_file, compile_rules_text, default_cache
from execgate.policy.model import NETWORK_PROTOCOLS
from execgate.policy.network import judge_network
from execgate.policy.network import rule_location as network_rule_location
from execgate.policy.requirements import load_requirements

SHOWN_ALTERNATIVES = 6


def register(subparsers: Any) -> None:
    rules = subparsers.add_parser(
        "rules",
        help="list, test and explain the rules in force",
        description="Inspect the layered policy (default, system, user, project, requirements).",
    )
    actions = rules.add_subparsers(dest="rules_command", metavar="ACTION")
    rules.set_defaults(handler=lambda _args: _usage(rules))

    listing = actions.add_parser("list", help="every layer, file and rule, with file:line")
    listing.add_argument("--full", action="store_true", help="show every alternative of a token")
    listing.set_defaults(handler=run_list)

    test = actions.add_parser(
        "test",
        help="load every layer and run every match/not_match example (exit 1 on failure)",
    )
    test.add_argument(
        "-r",
        "--rules",
        metavar="PATH",
        action="append",
        type=Path,
        help="test these files instead of the layers (repeatable)",
    )
    test.set_defaults(handler=run_test)

    explain = actions.add_parser(
        "explain",
        help="which rules match a command, from which file:line, and why the decision",
    )
    explain.add_argument("-r", "--rules", metavar="PATH", action="append", type=Path)
    explain.add_argument(
        "--no-resolve-host-executables",
        dest="resolve",
        action="store_false",
        help="match the first token literally only (the gate resolves program paths)",
    )
    explain.add_argument(
        "--host",
        metavar="HOST",
        help="explain which network_rule decides connections to HOST instead of a command",
    )
    explain.add_argument(
        "--protocol",
        choices=NETWORK_PROTOCOLS,
        help="with --host: only this way through the proxy (default: each)",
    )
    explain.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    explain.set_defaults(handler=run_explain, parser=explain)

    init = actions.add_parser(
        "init", help="write the built-in default policy to the user layer, to edit"
    )
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.set_defaults(handler=run_init)

    suggest = actions.add_parser(
        "suggest",
        help="allow rules that would have saved the prompts humans answered (from the log)",
        description=(
            "From the prompts people answered (decision log), propose the narrowest allow "
            "rules saving the most questions, never covering a command that was declined and "
            "never a banned prefix (python3, bash -lc, env, sudo, git, ...). Prints .rules "
            "lines; nothing is written."
        ),
        epilog="example:\n  execgate rules suggest --since 7d >> ~/.execgate/rules/default.rules",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suggest.add_argument("--since", metavar="WHEN", help="only prompts since then (1h, 7d)")
    suggest.add_argument(
        "--min-count",
        type=int,
        default=2,
        metavar="N",
        help="only rules that would have saved at least N questions (default 2)",
    )
    suggest.set_defaults(handler=run_suggest)

    trust = subparsers.add_parser(
        "trust",
        help="load the project rules of DIR (default: this repository) for commands run in DIR",
    )
    trust.add_argument("directory", nargs="?", type=Path, metavar="DIR")
    trust.set_defaults(handler=run_trust)
    untrust = subparsers.add_parser("untrust", help="stop loading the project rules of DIR")
    untrust.add_argument("directory", nargs="?", type=Path, metavar="DIR")
    untrust.set_defaults(handler=run_untrust)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


# --- list -----------------------------------------------------------------------------------


def _token_text(accepted: tuple[str, ...], full: bool) -> str:
    if len(accepted) == 1:
        return accepted[0]
    shown = accepted if full else accepted[:SHOWN_ALTERNATIVES]
    more = len(accepted) - len(shown)
    return "[" + "|".join(shown) + (f"|… {more} more" if more else "") + "]"


def rule_text(rule: PrefixRule, full: bool = False) -> str:
    parts = [rule.program, *(_token_text(tok, full) for tok in rule.rest)]
    return " ".join(parts)


def _print_rules(rules: list[PrefixRule], full: bool) -> None:
    for rule in rules:
        where = f"{rule.source.line}:{rule.source.column}" if rule.source else "?"
        note = f"  # {rule.justification}" if rule.justification else ""
        print(f"    {where:>8}  {rule.decision.value:<9}  {rule_text(rule, full)}{note}")


def run_list(args: argparse.Namespace) -> int:
    cwd = Path.cwd()
    config = load_config()
    loaded = load_layered_policy(cwd, config=config)
    by_file: dict[str, list[PrefixRule]] = {}
    for rule in loaded.policy.rules:
        if rule.source is not None:
            by_file.setdefault(rule.source.path.split("#", 1)[0], []).append(rule)
    for folder in loaded.folders:
        files = rules_files_in(folder.path)
        state = "" if files else "  (no rules files)"
        print(f"{folder.layer:<12} {folder.path}{state}")
        for path in files:
            print(f"  {path}")
            _print_rules(by_file.get(str(path), []), args.full)
    trusted = trusted_projects()
    for directory in project_dirs(cwd):
        if not is_trusted(directory, trusted) and (directory / ".execgate" / "rules").exists():
            print(
                f"{'project':<12} {directory / '.execgate' / 'rules'}  "
                f"(not trusted: run `execgate trust {directory}` to load it)"
            )
    for source in loaded.sources:
        if source.layer == "default":
            print(f"{'default':<12} {source.path}  (built in; used because no layer has rules)")
            _print_rules(by_file.get(str(source.path), []), args.full)
    requirements: dict[str, list[PrefixRule]] = {}
    for rule in loaded.policy.rules:
        if rule.source is not None and "#rules." in rule.source.path:
            requirements.setdefault(rule.source.path.split("#", 1)[0], []).append(rule)
    for origin, rules in requirements.items():
        print(f"{'requirements':<12} {origin}  (admin rules, applied last)")
        for rule in rules:
            assert rule.source is not None
            entry = rule.source.path.split("#", 1)[1]
            note = f"  # {rule.justification}" if rule.justification else ""
            print(f"    {entry:>24}  {rule.decision.value:<9}  {rule_text(rule, args.full)}{note}")
    if loaded.policy.host_executables:
        print("host executables (basename resolution is limited to these paths):")
        for name, allowed in sorted(loaded.policy.host_executables.items()):
            print(f"    {name}: {', '.join(allowed) if allowed else '(no path accepted)'}")
    if loaded.policy.network_rules:
        print("network rules (enforced by the proxy of a `--network proxy` sandbox):")
        for net in loaded.policy.network_rules:
            print(f"    {net.decision.value:<9}  {net.protocol}://{net.host}  [{net.source}]")
    _report_state(loaded)
    return 0


def _report_state(loaded: LoadedPolicy) -> None:
    for warning in loaded.warnings:
        print(f"execgate: warning: {warning}", file=sys.stderr)
    if loaded.fail_closed_reason:
        print(f"execgate: every exec is denied: {loaded.fail_closed_reason}", file=sys.stderr)


# --- test -----------------------------------------------------------------------------------


def _files_to_test(args: argparse.Namespace) -> list[tuple[str, Path, str | None]]:
    """(layer, path, text override) in load order."""
    if args.rules:
        return [("file", path, None) for path in args.rules]
    found: list[tuple[str, Path, str | None]] = []
    seen: set[str] = set()
    for folder in rules_folders(Path.cwd(), load_config()):
        real = os.path.realpath(folder.path)
        if real in seen:
            continue
        seen.add(real)
        found += [(folder.layer, path, None) for path in rules_files_in(folder.path)]
    found.append(("default", default_rules_path(), default_rules_text()))
    return found


def run_test(args: argparse.Namespace) -> int:
    cache: RulesCache | None = default_cache()
    builder = PolicyBuilder()
    failures: list[str] = []
    files = rules = examples = 0
    for layer, path, text in _files_to_test(args):
        if layer == "default" and rules:
            continue  # only loaded while no other layer has rules
        name = str(path)
        try:
            compiled: FileRules = (
                compile_rules_text(text, name, cache=cache)
                if text is not None
                else compile_rules_file(path, name, cache=cache)
            )
            builder.add_file(compiled)
        except PolicyError as exc:
            failures.append(str(exc))
            print(f"FAIL  {layer:<8} {name}", file=sys.stderr)
            continue
        files += 1
        rules += len(compiled.rules)
        examples += sum(len(c.matches) + len(c.not_matches) for c in compiled.examples)
        print(f"ok    {layer:<8} {name}  ({len(compiled.rules)} rules)")
    if not args.rules:
        try:
            requirements = load_requirements()
        except PolicyError as exc:
            failures.append(str(exc))
        else:
            for source in requirements.sources:
                print(f"ok    {'require':<8} {source}")
            for warning in requirements.warnings:
                print(f"execgate: warning: {warning}", file=sys.stderr)
            if requirements.fail_closed_reason:
                failures.append(requirements.fail_closed_reason)
    for failure in failures:
        print(f"execgate: error: {failure}", file=sys.stderr)
    verdict = "failed" if failures else "passed"
    print(f"{files} files, {rules} rules, {examples} examples: {verdict}")
    return 1 if failures else 0


# --- explain --------------------------------------------------------------------------------


def explain_text(evaluation: Evaluation, layers: dict[str, str]) -> str:
    lines = [f"command:  {render_command(evaluation.command)}"]
    decision = evaluation.decision.value if evaluation.decision else "none (no rule matches)"
    lines.append(f"decision: {decision}")
    if not evaluation.matches:
        lines.append(
            "No rule matches, so the policy has no decision: under execgate the command runs "
            "inside the sandbox."
        )
        return "\n".join(lines)
    lines.append(f"reason:   {evaluation.reason()}")
    lines.append("matching rules, in load order:")
    for match in evaluation.matches:
        source = match.source
        where = str(source) if source else "?"
        layer = layers.get(where.split("#", 1)[0].rsplit(":", 2)[0], "")
        layer_note = f" ({layer} layer)" if layer else ""
        lines.append(f"  {match.decision.value:<9}  {rule_text(match.rule)}")
        lines.append(f"      defined at {where}{layer_note}")
        lines.append(f"      matched prefix: {render_command(match.matched_prefix)}")
        if match.resolved_program:
            lines.append(
                f"      program resolved to {match.resolved_program} (rules for its basename)"
            )
        if match.justification:
            lines.append(f"      justification: {match.justification}")
    if len(evaluation.matches) > 1:
        lines.append("The strictest decision wins: forbidden > prompt > allow.")
    if evaluation.decision is not None and evaluation.decision.value == "allow":
        lines.append(
            "Under execgate, allow means the program is escalated: it runs outside the sandbox "
            "(with the network), and so does every program it starts; its environment is "
            "cleaned of variables that load other code or config (docs/policy.md, "
            '"What each decision grants").'
        )
    return "\n".join(lines)


def run_explain(args: argparse.Namespace) -> int:
    if args.protocol and not args.host:
        args.parser.error("--protocol only applies with --host")
    command = [] if args.host else command_tokens(args)
    if args.rules:  # the admin's requirements still apply on top
        from execgate.policy import load_chosen_policy

        loaded = load_chosen_policy(args.rules)
    else:
        loaded = load_layered_policy(Path.cwd())
    _report_state(loaded)
    policy = loaded.policy
    layers = {str(source.path): source.layer for source in loaded.sources}
    if args.host:
        protocols = [args.protocol] if args.protocol else list(NETWORK_PROTOCOLS)
        print(explain_host(policy, args.host, protocols, layers, load_config().network.default))
        return 0
    evaluation = policy.evaluate(command, resolve_host_executables=args.resolve)
    print(explain_text(evaluation, layers))
    return 0


_NETWORK_OUTCOME = {
    Decision.ALLOW: "the proxy forwards it",
    Decision.PROMPT: "a human is asked (once, for the session, or always)",
    Decision.FORBIDDEN: "the proxy refuses it, naming the rule",
}


def explain_host(
    policy: Policy,
    host: str,
    protocols: list[str],
    layers: dict[str, str],
    default: str | None,
) -> str:
    """Which ``network_rule`` decides connections to ``host`` over each protocol, and why."""
    lines: list[str] = []
    for protocol in protocols:
        try:
            judgement = judge_network(policy, host, protocol)
        except ValueError as exc:
            raise ExecgateError(f"--host {host!r}: {exc}") from None
        lines.append(f"{judgement.host} over {protocol}:")
        if protocol == "socks5_udp":
            lines.append("  the proxy relays no UDP (no UDP ASSOCIATE): always refused")
            continue
        for rule in judgement.matches:
            layer = layers.get(rule.source.path, "") if rule.source else ""
            note = f"  # {rule.justification}" if rule.justification else ""
            where = f"{network_rule_location(rule)}" + (f" [{layer}]" if layer else "")
            lines.append(f"  {rule.decision.value:<9}  {where}{note}")
        decision = judgement.decision
        if decision is None:
            shown = default or "prompt where a human can be asked, else deny"
            lines.append(f"  no network_rule names this host: network.default decides ({shown})")
        else:
            strictest = " (the strictest)" if len(judgement.matches) > 1 else ""
            lines.append(f"  decision: {decision.value}{strictest}: {_NETWORK_OUTCOME[decision]}")
    return "\n".join(lines)


# --- init, trust ----------------------------------------------------------------------------


def run_init(args: argparse.Namespace) -> int:
    target = paths.user_default_rules_file()
    if target.exists() and not args.force:
        raise ExecgateError(f"{target} already exists (use --force to replace it; it is kept)")
    make_private_dir(target.parent)
    if target.exists():  # --force: never lose what the user wrote
        backup = target.with_name(f"{target.name}.{time.strftime('%Y%m%d-%H%M%S')}.bak")
        target.rename(backup)
        print(f"kept the previous file as {backup}")
    write_atomically(target, default_rules_text().encode("utf-8"))
    print(f"wrote the default policy to {target}")
    return 0


def _directory(args: argparse.Namespace) -> Path:
    directory: Path = args.directory or project_root(Path.cwd())
    if not directory.is_dir():
        raise ExecgateError(f"{directory} is not a directory")
    return directory.resolve()


def run_trust(args: argparse.Namespace) -> int:
    directory = _directory(args)
    if trust_project(directory):
        print(f"trusted {directory}: its .execgate/rules and .codex/rules now load")
    else:
        print(f"{directory} was already trusted")
    return 0


def run_untrust(args: argparse.Namespace) -> int:
    directory = _directory(args)
    if untrust_project(directory):
        print(f"{directory} is no longer trusted")
    else:
        print(f"{directory} was not in the trust list")
    return 0


def run_suggest(args: argparse.Namespace) -> int:
    from execgate.decisionlog.query import parse_since, records
    from execgate.decisionlog.suggest import suggest
    from execgate.paths import decision_log_file

    since = parse_since(args.since) if args.since else None
    found = suggest(
        records(decision_log_file(), lambda r: since is None or float(r.get("time", 0)) >= since),
        min_count=max(1, args.min_count),
    )
    if not found:
        print("# no rule to suggest: no allowed prompt repeats without a declined one", flush=True)
        return 0
    for suggestion in found:
        print(suggestion.rules_text())
    return 0
