"""``.rules`` files: Starlark (``starlark-pyo3``) evaluated into rules, with Codex's errors.

Codex's builtins are native Starlark functions; ours are thin Starlark wrappers, defined in a
small prelude evaluated into each file's module, that hand their arguments, the Starlark types of
those arguments and the call stack to Python. That gives us what ``starlark-pyo3`` does not: the
location of every call (for ``rules list``/``explain`` and for errors found after the file was
read) and the difference between a tuple and a list (both arrive in Python as lists), so argument
errors can be worded exactly as Codex words them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from execgate.policy.codex_text import (
    rust_debug_str,
    rust_debug_str_list,
    shlex_join,
    shlex_split,
    truncate_starlark_repr,
)
from execgate.policy.evaluate import Policy, normalize_absolute_path
from execgate.policy.model import (
    Decision,
    NetworkRule,
    PatternToken,
    PolicyError,
    PrefixRule,
    RuleMatch,
    SourceLocation,
)

if TYPE_CHECKING:
    import starlark as sl

PRELUDE_NAME = "<execgate builtins>"
_BRIDGE = "__execgate_builtin__"
_PRELUDE_LINES = {2: "prefix_rule", 4: "host_executable", 6: "network_rule"}
_PRELUDE = "".join(
    f"def {name}(*args, **kwargs):\n"
    f'    {_BRIDGE}("{name}", call_stack(strip_frames = 1), args, kwargs,'
    " [type(a) for a in args], {k: type(v) for k, v in kwargs.items()})\n"
    for name in _PRELUDE_LINES.values()
)

# Parameters in Codex's order (positional use follows it) and how many are required.
_SIGNATURES: dict[str, tuple[tuple[str, ...], int]] = {
    "prefix_rule": (
        ("pattern", "decision", "match", "not_match", "justification", "canonical_matching"),
        1,
    ),
    "host_executable": (("name", "paths"), 2),
    "network_rule": (("host", "protocol", "decision", "justification"), 3),
}
# The Starlark type each parameter must have, as Codex names it in errors (others: `str`).
_EXPECTED = {
    "pattern": "list",
    "match": "list",
    "not_match": "list",
    "paths": "list",
    "canonical_matching": "bool",
}
_STARLARK_TYPE_FOR = {"list": "list", "str": "string", "bool": "bool"}

_NETWORK_PROTOCOLS = {
    "http": "http",
    "https": "https",
    "https_connect": "https",
    "http-connect": "https",
    "socks5_tcp": "socks5_tcp",
    "socks5_udp": "socks5_udp",
}

_LOCATION_RE = re.compile(r"^\s*--> (.*):(\d+):(\d+)$", re.MULTILINE)
_MISSING = object()


def _dialect() -> sl.Dialect:
    import starlark as sl  # here: a policy loaded from the cache never evaluates Starlark

    dialect = sl.Dialect.extended()
    dialect.enable_f_strings = True
    return dialect


@dataclass(frozen=True, slots=True)
class ExampleCheck:
    """A ``prefix_rule`` call's ``match``/``not_match`` examples, checked after the file."""

    rule_indexes: tuple[int, ...]  # the call's rules (after first-token expansion)
    matches: tuple[tuple[str, ...], ...]
    not_matches: tuple[tuple[str, ...], ...]
    location: SourceLocation


@dataclass
class FileRules:
    """Everything one rules file defines, in definition order. Cacheable: depends only on
    the file's text and the name it was loaded under."""

    identifier: str
    rules: list[PrefixRule] = field(default_factory=list)
    network_rules: list[NetworkRule] = field(default_factory=list)
    host_executables: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    examples: list[ExampleCheck] = field(default_factory=list)


class _RuleError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _fail(message: str) -> NoReturn:
    raise _RuleError(message)


def _type_name(value: object) -> str:
    """The Starlark type name of a value that crossed into Python."""
    if value is None:
        return "NoneType"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return type(value).__name__


def _starlark_repr(value: object, type_name: str) -> str:
    import starlark as sl

    try:
        module = sl.Module()
        module["v"] = value
        text = str(sl.eval(module, sl.parse("<repr>", "repr(v)"), sl.Globals.standard()))
    except (sl.StarlarkError, TypeError, ValueError):
        text = repr(value)
    if type_name == "tuple" and isinstance(value, list) and text.startswith("["):
        text = "(" + text[1:-1] + ("," if len(value) == 1 else "") + ")"
    return truncate_starlark_repr(text)


def _bind(
    name: str,
    args: list[Any],
    kwargs: dict[str, Any],
    arg_types: list[str],
    kwarg_types: dict[str, str],
) -> dict[str, tuple[Any, str]]:
    """Starlark's argument binding for a native function, with its error texts and order."""
    params, required = _SIGNATURES[name]
    if len(args) > len(params):
        _fail(f"Found {len(args) - len(params)} extra positional argument(s) for call to {name}")
    bound: dict[str, tuple[Any, str]] = {
        param: (value, arg_types[i])
        for i, (param, value) in enumerate(zip(params, args, strict=False))
    }
    extra: list[str] = []
    for key, value in kwargs.items():
        if key in params:
            if key in bound:
                _fail(f"Argument `{key}` occurs more than once")
            bound[key] = (value, kwarg_types.get(key, _type_name(value)))
        else:
            extra.append(key)
    for param in params[:required]:
        if param not in bound:
            _fail(f"Missing parameter `{param}` for call to `{name}`")
    if extra:
        names = " ".join(f"`{key}`" for key in extra)
        _fail(f"Found {names} extra named parameter(s) for call to {name}")
    for param in params:
        if param in bound:
            value, actual = bound[param]
            expected = _EXPECTED.get(param, "str")
            if actual != _STARLARK_TYPE_FOR[expected]:
                _fail(
                    f"Type of parameter `{param}` doesn't match, expected `{expected}`, "
                    f"actual `{actual} (repr: {_starlark_repr(value, actual)})`"
                )
    return bound


def _parse_decision(raw: str) -> Decision:
    try:
        return Decision.parse(raw)
    except ValueError as exc:
        _fail(str(exc))


def _parse_justification(raw: object) -> str | None:
    if raw is _MISSING:
        return None
    assert isinstance(raw, str)
    if not raw.strip():
        _fail("invalid rule: justification cannot be empty")
    return raw


def _parse_pattern(pattern: list[Any]) -> list[PatternToken]:
    tokens: list[PatternToken] = []
    for element in pattern:
        if isinstance(element, str):
            tokens.append((element,))
        elif isinstance(element, list):
            for alternative in element:
                if not isinstance(alternative, str):
                    _fail(
                        "invalid pattern element: pattern alternative must be a string "
                        f"(got {_type_name(alternative)})"
                    )
            if not element:
                _fail("invalid pattern element: pattern alternatives cannot be empty")
            tokens.append(tuple(element))
        else:
            _fail(
                "invalid pattern element: pattern element must be a string or list of strings "
                f"(got {_type_name(element)})"
            )
    if not tokens:
        _fail("invalid pattern element: pattern cannot be empty")
    return tokens


def _parse_example(example: object) -> tuple[str, ...]:
    if isinstance(example, str):
        words = shlex_split(example)
        if words is None:
            _fail("invalid example: example string has invalid shell syntax")
        if not words:
            _fail("invalid example: example cannot be an empty string")
        return tuple(words)
    if isinstance(example, list):
        for token in example:
            if not isinstance(token, str):
                _fail(f"invalid example: example tokens must be strings (got {_type_name(token)})")
        if not example:
            _fail("invalid example: example cannot be an empty list")
        return tuple(example)
    _fail(
        f"invalid example: example must be a string or list of strings (got {_type_name(example)})"
    )


def _validate_host_executable_name(name: str) -> None:
    if not name:
        _fail("invalid rule: host_executable name cannot be empty")
    if "/" in name or name in (".", ".."):
        _fail(f"invalid rule: host_executable name must be a bare executable name (got {name})")


def normalize_network_host(raw: str) -> str:
    """Codex's host normalisation for ``network_rule`` (raises ``ValueError`` with its text)."""
    host = raw.strip()
    if not host:
        raise ValueError("invalid rule: network_rule host cannot be empty")
    if "://" in host or any(ch in host for ch in "/?#"):
        raise ValueError(
            "invalid rule: network_rule host must be a hostname or IP literal "
            "(without scheme or path)"
        )
    if host.startswith("["):
        inside, bracket, rest = host[1:].partition("]")
        if not bracket:
            raise ValueError(
                "invalid rule: network_rule host has an invalid bracketed IPv6 literal"
            )
        port = rest[1:] if rest.startswith(":") else None
        if rest and not (port and port.isascii() and port.isdigit()):
            raise ValueError(
                f"invalid rule: network_rule host contains an unsupported suffix: {raw}"
            )
        host = inside
    elif host.count(":") == 1:
        candidate, _, port = host.rpartition(":")
        if candidate and port and port.isascii() and port.isdigit():
            host = candidate
    normalized = host.rstrip(".").strip().lower()
    if not normalized:
        raise ValueError("invalid rule: network_rule host cannot be empty")
    if "*" in normalized:
        raise ValueError(
            "invalid rule: network_rule host must be a specific host; wildcards are not allowed"
        )
    if any(ch.isspace() for ch in normalized):
        raise ValueError("invalid rule: network_rule host cannot contain whitespace")
    return normalized


class _FileEvaluation:
    """The state of evaluating one file: the builtins append to ``result``."""

    def __init__(self, text: str, identifier: str) -> None:
        self.lines = text.split("\n")
        self.identifier = identifier
        self.result = FileRules(identifier)
        self.failure: PolicyError | None = None
        self._frame_marker = f"\n  * {identifier}:"

    # -- locations ---------------------------------------------------------------------------

    def _call_line(self, stack: str) -> int:
        """The line of the innermost frame in this file, from a ``call_stack()`` rendering."""
        start = stack.rfind(self._frame_marker)
        if start < 0:
            return 1
        head = stack[start + len(self._frame_marker) :].split("\n", 1)[0]
        number = head.rpartition(", in ")[0]
        return int(number) if number.isdigit() else 1

    def _column(self, line: int, name: str) -> int:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        found = re.search(rf"(?<![\w.]){re.escape(name)}\s*\(", text)
        if found:
            return found.start() + 1
        return len(text) - len(text.lstrip()) + 1

    def location(self, stack: str, name: str) -> SourceLocation:
        line = self._call_line(stack)
        return SourceLocation(self.identifier, line, self._column(line, name))

    # -- the bridge the prelude calls ------------------------------------------------------

    def builtin(
        self,
        name: str,
        stack: str,
        args: list[Any],
        kwargs: dict[str, Any],
        arg_types: list[str],
        kwarg_types: dict[str, str],
    ) -> None:
        location = self.location(stack, name)
        try:
            bound = _bind(name, args, kwargs, arg_types, kwarg_types)
            values = {param: value for param, (value, _) in bound.items()}
            self._handlers[name](self, values, location)
        except _RuleError as exc:
            self.failure = _error_at(exc.message, location)
            raise
        except Exception as exc:  # a bug in a builtin: still no traceback for the user
            self.failure = _error_at(f"internal error in {name}: {exc!r}", location)
            raise

    def _prefix_rule(self, values: dict[str, Any], location: SourceLocation) -> None:
        decision = _parse_decision(values.get("decision", "allow"))
        justification = _parse_justification(values.get("justification", _MISSING))
        tokens = _parse_pattern(values["pattern"])
        matches = tuple(_parse_example(e) for e in values.get("match", []))
        not_matches = tuple(_parse_example(e) for e in values.get("not_match", []))
        canonical = bool(values.get("canonical_matching", False))
        rules = self.result.rules
        first, rest = tokens[0], tuple(tokens[1:])
        start = len(rules)
        for program in first:
            rules.append(PrefixRule(program, rest, decision, justification, canonical, location))
        if matches or not_matches:
            indexes = tuple(range(start, len(rules)))
            self.result.examples.append(ExampleCheck(indexes, matches, not_matches, location))

    def _host_executable(self, values: dict[str, Any], location: SourceLocation) -> None:
        name: str = values["name"]
        _validate_host_executable_name(name)
        paths: list[str] = []
        for raw in values["paths"]:
            if not isinstance(raw, str):
                _fail(
                    f"invalid rule: host_executable paths must be strings (got {_type_name(raw)})"
                )
            if not raw.startswith("/"):
                _fail(f"invalid rule: host_executable paths must be absolute (got {raw})")
            path = normalize_absolute_path(raw)
            if path.rpartition("/")[2] != name:
                _fail(f"invalid rule: host_executable path `{raw}` must have basename `{name}`")
            if path not in paths:
                paths.append(path)
        self.result.host_executables.append((name, tuple(paths)))

    def _network_rule(self, values: dict[str, Any], location: SourceLocation) -> None:
        protocol = _NETWORK_PROTOCOLS.get(values["protocol"])
        if protocol is None:
            _fail(
                "invalid rule: network_rule protocol must be one of http, https, socks5_tcp, "
                f"socks5_udp (got {values['protocol']})"
            )
        raw_decision: str = values["decision"]
        decision = Decision.FORBIDDEN if raw_decision == "deny" else _parse_decision(raw_decision)
        justification = _parse_justification(values.get("justification", _MISSING))
        try:
            host = normalize_network_host(values["host"])
        except ValueError as exc:
            _fail(str(exc))
        self.result.network_rules.append(
            NetworkRule(host, protocol, decision, justification, location)
        )

    _handlers: ClassVar[
        dict[str, Callable[[_FileEvaluation, dict[str, Any], SourceLocation], None]]
    ] = {
        "prefix_rule": _prefix_rule,
        "host_executable": _host_executable,
        "network_rule": _network_rule,
    }

    # -- errors from Starlark itself -------------------------------------------------------

    def starlark_failure(self, text: str) -> PolicyError:
        message = next(
            (line[len("error: ") :] for line in text.splitlines() if line.startswith("error: ")),
            text.strip().splitlines()[0] if text.strip() else "evaluation failed",
        )
        found = _LOCATION_RE.search(text)
        if found is None:
            return PolicyError(message, path=self.identifier)
        path, line, column = found.group(1), int(found.group(2)), int(found.group(3))
        if path == PRELUDE_NAME:
            # Raised while handing arguments to Python: blame the user's call instead.
            builtin = _PRELUDE_LINES.get(line, "prefix_rule")
            line = self._call_line(text)
            column = self._column(line, builtin)
            kind = re.search(r"not supported on type `([^`]+)`", message)
            if "serde::serialize" in message and kind:
                message = f"`{builtin}` cannot take a value of type `{kind.group(1)}`"
            path = self.identifier
        return PolicyError(message, path=path, line=line, column=column)


def _error_at(
    message: str, location: SourceLocation, *, readable: str | None = None
) -> PolicyError:
    return PolicyError(
        message,
        path=location.path,
        line=location.line,
        column=location.column,
        readable=readable,
    )


def evaluate_rules_text(text: str, identifier: str) -> FileRules:
    """Run one rules file's Starlark; raise ``PolicyError`` naming file:line:col on failure.

    Examples are *not* checked here: that needs the host_executable definitions of every file
    loaded so far (see ``PolicyBuilder``).
    """
    import starlark as sl

    state = _FileEvaluation(text, identifier)
    dialect = _dialect()
    module = sl.Module()
    module.add_callable(_BRIDGE, state.builtin)
    sl.eval(
        module,
        sl.parse(PRELUDE_NAME, _PRELUDE, dialect),
        sl.Globals.extended_by([sl.LibraryExtension.CallStack]),
    )
    try:
        sl.eval(module, sl.parse(identifier, text, dialect), sl.Globals.standard())
    except sl.StarlarkError as exc:
        if state.failure is not None:
            raise state.failure from None
        rendered = str(exc)
        # A file ending in an expression returns its value, which starlark-pyo3 then fails to
        # convert when it is e.g. a function; everything has run by then.
        if " --> " not in rendered and "serde::serialize" in rendered:
            return state.result
        raise state.starlark_failure(rendered) from None
    return state.result


# --- example validation and Codex's Debug renderings ----------------------------------------


def _debug_option(value: str | None, wrap: str = "") -> str:
    if value is None:
        return "None"
    inner = rust_debug_str(value)
    return f"Some({wrap}({inner}))" if wrap else f"Some({inner})"


def debug_rule(rule: PrefixRule) -> str:
    """``format!("{:?}", rule)`` for a Codex ``PrefixRule``."""
    rest = ", ".join(
        f"Single({rust_debug_str(tok[0])})"
        if len(tok) == 1
        else f"Alts({rust_debug_str_list(tok)})"
        for tok in rule.rest
    )
    return (
        "PrefixRule { pattern: PrefixPattern { canonical_matching: "
        f"{'true' if rule.canonical_matching else 'false'}, first: {rust_debug_str(rule.program)}, "
        f"rest: [{rest}] }}, decision: {rule.decision.name.title()}, "
        f"justification: {_debug_option(rule.justification)} }}"
    )


def debug_match(match: RuleMatch) -> str:
    """``format!("{:?}", rule_match)`` for a Codex ``PrefixRuleMatch``."""
    return (
        f"PrefixRuleMatch {{ matched_prefix: {rust_debug_str_list(match.matched_prefix)}, "
        f"decision: {match.decision.name.title()}, "
        f"resolved_program: {_debug_option(match.resolved_program, 'AbsolutePathBuf')}, "
        f"justification: {_debug_option(match.justification)} }}"
    )


def _render_example(example: Sequence[str]) -> str:
    joined = shlex_join(example)
    return joined if joined is not None else "unable to render example"


def check_examples(
    rules: Sequence[PrefixRule],
    check: ExampleCheck,
    host_executables: dict[str, tuple[str, ...]],
) -> None:
    """Codex's example validation: against only that call's rules, with resolution on."""
    policy = Policy(tuple(rules), (), host_executables)
    for example in check.not_matches:
        found = policy.matches(example, resolve_host_executables=True)
        if found:
            raise _error_at(
                f"expected example to not match rule `{debug_match(found[0])}`: "
                f"{_render_example(example)}",
                check.location,
                readable=f"not_match example `{_render_example(example)}` matches this rule "
                f"(prefix `{_render_example(found[0].matched_prefix)}`, "
                f"{found[0].decision.value})",
            )
    unmatched = [
        _render_example(example)
        for example in check.matches
        if not policy.matches(example, resolve_host_executables=True)
    ]
    if unmatched:
        patterns = ", ".join(f"`{rule.pattern_text()}`" for rule in rules)
        raise _error_at(
            "expected every example to match at least one rule. rules: "
            f"{rust_debug_str_list(debug_rule(rule) for rule in rules)}; "
            f"unmatched examples: {rust_debug_str_list(unmatched)}",
            check.location,
            readable=f"match example{'s' if len(unmatched) > 1 else ''} "
            f"{', '.join(f'`{e}`' for e in unmatched)} "
            f"{'do' if len(unmatched) > 1 else 'does'} not match this rule ({patterns})",
        )


class PolicyBuilder:
    """Accumulates files (and requirement rules) into one policy, in load order.

    ``host_executable`` definitions accumulate across files, the last one for a name winning,
    and each file's examples are checked once that file is in, as Codex does.
    """

    def __init__(self) -> None:
        self.rules: list[PrefixRule] = []
        self.network_rules: list[NetworkRule] = []
        self.host_executables: dict[str, tuple[str, ...]] = {}

    def add_file(self, file_rules: FileRules) -> None:
        for name, paths in file_rules.host_executables:
            self.host_executables[name] = paths
        for check in file_rules.examples:
            rules = [file_rules.rules[i] for i in check.rule_indexes]
            check_examples(rules, check, self.host_executables)
        self.rules.extend(file_rules.rules)
        self.network_rules.extend(file_rules.network_rules)

    def add_rules(self, rules: Sequence[PrefixRule]) -> None:
        self.rules.extend(rules)

    def build(self) -> Policy:
        return Policy(tuple(self.rules), tuple(self.network_rules), dict(self.host_executables))
