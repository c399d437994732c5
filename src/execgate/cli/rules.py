"""``execgate rules list|test|explain|init`` and ``execgate trust|untrust [DIR]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from execgate import paths
from execgate.cli.check import command_tokens
from execgate.cli.workdir import working_directory
from execgate.config import Config, load_config
from execgate.errors import ExecgateError
from execgate.files import make_private_dir, write_atomically
from execgate.policy import (
    Decision,
    Evaluation,
    LoadedPolicy,
    Policy,
    PolicyError,
    PrefixRule,
    RuleMatch,
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
from execgate.policy.network import NetworkJudgement, judge_network
from execgate.policy.network import rule_location as network_rule_location
from execgate.policy.requirements import load_requirements

SHOWN_ALTERNATIVES = 6


def register(subparsers: Any) -> None:
    rules = subparsers.add_parser(
        "rules",
        help="list, test and explain the rules in force",
        description="Inspect the layered policy (default, system, user, project, requirements).",
        examples=["execgate rules list", "execgate rules explain -- git push origin main"],
    )
    actions = rules.add_subparsers(dest="rules_command", metavar="ACTION")
    rules.set_defaults(handler=lambda _args: _usage(rules))

    listing = actions.add_parser(
        "list",
        help="every layer, file and rule, with file:line",
        description="List every rules folder of every layer for the current directory, each "
        "file and each rule with line:column, decision and pattern; whether the built-in "
        "default policy is active; admin requirements, host executables, network rules.",
        examples=["execgate rules list", "execgate rules list --full --json"],
    )
    listing.add_argument("--full", action="store_true", help="show every alternative of a token")
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    listing.set_defaults(handler=run_list)

    test = actions.add_parser(
        "test",
        help="load every layer and run every match/not_match example (exit 1 on failure)",
        description="Load every rules file of every layer (or the given files) one by one, "
        "run each prefix_rule's match/not_match examples, and report every file that fails, "
        "not just the first. Warns about pattern tokens that look like wildcards (tokens "
        "match exact words). Exit status 0 when everything passes, 1 otherwise.",
        examples=["execgate rules test", "execgate rules test -r ./my.rules --json"],
    )
    test.add_argument(
        "-r",
        "--rules",
        metavar="PATH",
        action="append",
        type=Path,
        help="test these files instead of the layers (repeatable)",
    )
    test.add_argument("--json", action="store_true", help="print one JSON object")
    test.set_defaults(handler=run_test)

    explain = actions.add_parser(
        "explain",
        help="which rules match a command, from which file:line, and why the decision",
        description="Evaluate COMMAND as the gate would and show every matching rule: where "
        "it is defined (file:line:col and layer), the matched prefix, the resolved program, "
        "the justification, and the decision with its reason.",
        examples=[
            "execgate rules explain -- rm -rf /",
            "execgate rules explain --json -- git push --force",
            "execgate rules explain --host pypi.org --protocol https",
        ],
    )
    explain.add_argument(
        "-r", "--rules", metavar="PATH", action="append", type=Path,
        help="explain with exactly these rules files (repeatable; admin requirements apply)",
    )  # fmt: skip
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
    explain.add_argument("--json", action="store_true", help="print one JSON object")
    explain.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    explain.set_defaults(handler=run_explain, parser=explain)

    init = actions.add_parser(
        "init",
        help="write the built-in default policy to the user layer, to edit",
        description="Write a copy of the built-in default policy (with your home directory "
        "filled in) to $EXECGATE_HOME/rules/default.rules, to read and extend. The built-in "
        "policy stays active unless config.toml says default_policy = false.",
        examples=["execgate rules init", "execgate rules init --force   # keeps a backup"],
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
        examples=["execgate rules suggest --since 7d >> ~/.execgate/rules/default.rules"],
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
        description="Put DIR (default: the current repository's root, else the current "
        "directory) on the trust list: its own .execgate/rules and .codex/rules then load "
        "for commands run in DIR or below it.",
        examples=["execgate trust", "execgate trust ~/src/myproject"],
    )
    trust.add_argument("directory", nargs="?", type=Path, metavar="DIR")
    trust.set_defaults(handler=run_trust)
    untrust = subparsers.add_parser(
        "untrust",
        help="stop loading the project rules of DIR",
        description="Take DIR (default: the current repository's root, else the current "
        "directory) off the trust list.",
        examples=["execgate untrust", "execgate untrust ~/src/myproject"],
    )
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


def rule_json(rule: PrefixRule) -> dict[str, Any]:
    """A rule for ``--json`` output: each pattern position is the list of tokens it accepts."""
    source = rule.source
    return {
        "pattern": [[rule.program], *(list(accepted) for accepted in rule.rest)],
        "decision": rule.decision.value,
        "justification": rule.justification,
        "source": str(source) if source else None,
    }


def default_policy_state(config: Config, loaded: LoadedPolicy | None) -> dict[str, Any]:
    """Whether the built-in default policy is part of ``loaded`` (``None``: ``--rules``
    files, which replace every layer), and why."""
    if loaded is None:
        active, why = False, "not loaded: --rules names the files to use"
    elif any(source.layer == "default" for source in loaded.sources):
        active, why = True, "under every other layer; default_policy = false turns it off"
    else:
        active, why = False, f"turned off: default_policy = false in {config.path}"
    return {"active": active, "path": str(default_rules_path()), "why": why}


def run_list(args: argparse.Namespace) -> int:
    cwd = working_directory()
    config = load_config()
    loaded = load_layered_policy(cwd, config=config)
    rules_by_file: dict[str, list[PrefixRule]] = {}
    for rule in loaded.policy.rules:
        if rule.source is not None:
            rules_by_file.setdefault(rule.source.path.split("#", 1)[0], []).append(rule)
    default = default_policy_state(config, loaded)

    def rules_of(path: Path | str) -> list[dict[str, Any]]:
        return [rule_json(rule) for rule in rules_by_file.get(str(path), [])]

    trusted = trusted_projects()
    untrusted = [
        directory / ".execgate" / "rules"
        for directory in project_dirs(cwd)
        if not is_trusted(directory, trusted) and (directory / ".execgate" / "rules").exists()
    ]
    folders = [(folder, rules_files_in(folder.path)) for folder in loaded.folders]
    requirements = {
        source: rules
        for source, rules in rules_by_file.items()
        if any(r.source is not None and "#rules." in r.source.path for r in rules)
    }
    if args.json:
        print(
            _json(
                {
                    "default_policy": {
                        **default,
                        "rules": rules_of(default["path"]),
                    },
                    "folders": [
                        {
                            "layer": folder.layer,
                            "path": str(folder.path),
                            "files": [
                                {"path": str(path), "rules": rules_of(path)} for path in files
                            ],
                        }
                        for folder, files in folders
                    ],
                    "untrusted_project_folders": [str(path) for path in untrusted],
                    "requirements": [
                        {"source": source, "rules": [rule_json(r) for r in rules]}
                        for source, rules in requirements.items()
                    ],
                    "host_executables": dict(sorted(loaded.policy.host_executables.items())),
                    "network_rules": [
                        {
                            "decision": net.decision.value,
                            "protocol": net.protocol,
                            "host": net.host,
                            "source": str(net.source) if net.source else None,
                        }
                        for net in loaded.policy.network_rules
                    ],
                    "warnings": list(loaded.warnings),
                    "fail_closed_reason": loaded.fail_closed_reason,
                }
            )
        )
        return 0
    state = "active" if default["active"] else "OFF"
    print(f"{'default':<12} {default['path']}  (built in, {state}: {default['why']})")
    _print_rules(rules_by_file.get(default["path"], []), args.full)
    for folder, files in folders:
        print(f"{folder.layer:<12} {folder.path}{'' if files else '  (no rules files)'}")
        for path in files:
            print(f"  {path}")
            _print_rules(rules_by_file.get(str(path), []), args.full)
    for path in untrusted:
        print(
            f"{'project':<12} {path}  "
            f"(not trusted: run `execgate trust {path.parent.parent}` to load it)"
        )
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


def _json(value: Any) -> str:
    # ASCII only: a rule's or command's hidden characters stay \u escapes on a terminal
    return json.dumps(value, ensure_ascii=True, indent=2)


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
    config = load_config()
    found: list[tuple[str, Path, str | None]] = []
    if config.default_policy:
        found.append(("default", default_rules_path(), default_rules_text()))
    seen: set[str] = set()
    for folder in rules_folders(working_directory(), config):
        real = os.path.realpath(folder.path)
        if real in seen:
            continue
        seen.add(real)
        found += [(folder.layer, path, None) for path in rules_files_in(folder.path)]
    return found


#: Characters that make a pattern token look like a wildcard or a regular expression; Codex
#: (and execgate) match every token as an exact word.
_WILDCARD_CHARS = frozenset("*?")


def wildcard_warnings(compiled: FileRules) -> list[str]:
    """A warning for every pattern token that looks like a wildcard (``git.*``, ``*``)."""
    warnings = []
    for rule in compiled.rules:
        for accepted in ((rule.program,), *rule.rest):
            for token in accepted:
                if _WILDCARD_CHARS & set(token) or token.endswith(".+"):
                    where = f"{rule.source}: " if rule.source else ""
                    warnings.append(
                        f"{where}token {json.dumps(token, ensure_ascii=False)} is matched "
                        "literally, not as a wildcard (a pattern token is one exact word; list "
                        'alternatives instead: ["a", "b"])'
                    )
    return list(dict.fromkeys(warnings))


def run_test(args: argparse.Namespace) -> int:
    cache: RulesCache | None = default_cache()
    builder = PolicyBuilder()
    failures: list[str] = []
    warnings: list[str] = []
    tested: list[dict[str, Any]] = []
    files = rules = examples = 0
    for layer, path, text in _files_to_test(args):
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
            tested.append({"layer": layer, "path": name, "ok": False, "error": str(exc)})
            if not args.json:
                print(f"FAIL  {layer:<8} {name}", file=sys.stderr)
            continue
        files += 1
        rules += len(compiled.rules)
        count = sum(len(c.matches) + len(c.not_matches) for c in compiled.examples)
        examples += count
        if layer != "default":
            warnings += wildcard_warnings(compiled)
        tested.append(
            {"layer": layer, "path": name, "ok": True, "rules": len(compiled.rules),
             "examples": count}
        )  # fmt: skip
        if not args.json:
            print(f"ok    {layer:<8} {name}  ({len(compiled.rules)} rules)")
    requirement_sources: list[str] = []
    if not args.rules:
        try:
            requirements = load_requirements()
        except PolicyError as exc:
            failures.append(str(exc))
        else:
            requirement_sources = list(requirements.sources)
            if not args.json:
                for source in requirements.sources:
                    print(f"ok    {'require':<8} {source}")
            warnings += requirements.warnings
            if requirements.fail_closed_reason:
                failures.append(requirements.fail_closed_reason)
    if args.json:
        print(
            _json(
                {"passed": not failures, "files": tested, "requirements": requirement_sources,
                 "rules": rules, "examples": examples, "warnings": warnings, "errors": failures}
            )
        )  # fmt: skip
        return 1 if failures else 0
    for warning in warnings:
        print(f"execgate: warning: {warning}", file=sys.stderr)
    for failure in failures:
        print(f"execgate: error: {failure}", file=sys.stderr)
    verdict = "failed" if failures else "passed"
    print(f"{files} files, {rules} rules, {examples} examples: {verdict}")
    return 1 if failures else 0


# --- explain --------------------------------------------------------------------------------


def explain_text(evaluation: Evaluation, layers: dict[str, str], default: dict[str, Any]) -> str:
    lines = [f"command:  {render_command(evaluation.command)}"]
    decision = evaluation.decision.value if evaluation.decision else "none (no rule matches)"
    lines.append(f"decision: {decision}")
    state = "active" if default["active"] else "OFF"
    lines.append(f"built-in default policy: {state} ({default['why']})")
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
        layer = _layer_of(match, layers)
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


def _layer_of(match: RuleMatch, layers: dict[str, str]) -> str:
    where = str(match.source) if match.source else "?"
    return layers.get(where.split("#", 1)[0].rsplit(":", 2)[0], "")


def explain_json(
    evaluation: Evaluation, layers: dict[str, str], default: dict[str, Any]
) -> dict[str, Any]:
    return {
        "command": list(evaluation.command),
        "decision": evaluation.decision.value if evaluation.decision else None,
        "reason": evaluation.reason() if evaluation.matches else None,
        "matches": [
            {
                **rule_json(match.rule),
                "layer": _layer_of(match, layers) or None,
                "matched_prefix": list(match.matched_prefix),
                "resolved_program": match.resolved_program,
            }
            for match in evaluation.matches
        ],
        "default_policy": default,
    }


def run_explain(args: argparse.Namespace) -> int:
    if args.protocol and not args.host:
        args.parser.error("--protocol only applies with --host")
    command = [] if args.host else command_tokens(args)
    if args.rules:  # the admin's requirements still apply on top
        from execgate.policy import load_chosen_policy

        loaded = load_chosen_policy(args.rules)
        default = default_policy_state(Config(), None)
    else:
        config = load_config()
        loaded = load_layered_policy(working_directory(), config=config)
        default = default_policy_state(config, loaded)
    _report_state(loaded)
    policy = loaded.policy
    layers = {str(source.path): source.layer for source in loaded.sources}
    if args.host:
        protocols = [args.protocol] if args.protocol else list(NETWORK_PROTOCOLS)
        network_default = load_config().network.default
        if args.json:
            print(_json(explain_host_json(policy, args.host, protocols, layers, network_default)))
        else:
            print(explain_host(policy, args.host, protocols, layers, network_default))
        return 0
    evaluation = policy.evaluate(command, resolve_host_executables=args.resolve)
    if args.json:
        print(_json(explain_json(evaluation, layers, default)))
    else:
        print(explain_text(evaluation, layers, default))
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
        judgement = _judge_host(policy, host, protocol)
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


def explain_host_json(
    policy: Policy,
    host: str,
    protocols: list[str],
    layers: dict[str, str],
    default: str | None,
) -> dict[str, Any]:
    """:func:`explain_host` as one JSON object: per protocol, the matching rules and the
    decision (``null``: no rule names the host, ``network_default`` decides)."""
    judged = []
    normalised = host
    for protocol in protocols:
        judgement = _judge_host(policy, host, protocol)
        normalised, decision = judgement.host, judgement.decision
        judged.append(
            {
                "protocol": protocol,
                "relayed": protocol != "socks5_udp",  # no UDP ASSOCIATE: always refused
                "decision": decision.value if decision else None,
                "matches": [
                    {
                        "decision": rule.decision.value,
                        "location": network_rule_location(rule),
                        "layer": layers.get(rule.source.path) if rule.source else None,
                        "justification": rule.justification,
                    }
                    for rule in judgement.matches
                ],
            }
        )
    return {
        "host": normalised,
        "protocols": judged,
        "network_default": default,
    }


def _judge_host(policy: Policy, host: str, protocol: str) -> NetworkJudgement:
    try:
        return judge_network(policy, host, protocol)
    except ValueError as exc:
        raise ExecgateError(f"--host {host!r}: {exc}") from None


# --- init, trust ----------------------------------------------------------------------------


def run_init(args: argparse.Namespace) -> int:
    target = paths.user_default_rules_file()
    if target.exists() and not args.force:
        raise ExecgateError(f"{target} already exists (use --force to replace it; it is kept)")
    try:
        make_private_dir(target.parent)
        if target.exists():  # --force: never lose what the user wrote
            backup = target.with_name(f"{target.name}.{time.strftime('%Y%m%d-%H%M%S')}.bak")
            target.rename(backup)
            print(f"kept the previous file as {backup}")
        write_atomically(target, default_rules_text().encode("utf-8"))
    except OSError as exc:
        raise ExecgateError(
            f"cannot write {target}: {exc.strerror} (set EXECGATE_HOME to a folder you can write)"
        ) from None
    print(f"wrote the default policy to {target}")
    print(
        "the built-in copy stays active under it; to use only yours, put "
        f"`default_policy = false` in {paths.config_file()}"
    )
    return 0


def _directory(args: argparse.Namespace) -> Path:
    directory: Path = args.directory or project_root(working_directory())
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
    from execgate.decisionlog.query import parse_since, record_time, records
    from execgate.decisionlog.suggest import suggest
    from execgate.paths import decision_log_file

    since = parse_since(args.since) if args.since else None
    found = suggest(
        records(decision_log_file(), lambda r: since is None or record_time(r) >= since),
        min_count=max(1, args.min_count),
    )
    if not found:
        print("# no rule to suggest: no allowed prompt repeats without a declined one", flush=True)
        return 0
    for suggestion in found:
        print(suggestion.rules_text())
    return 0
