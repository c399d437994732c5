"""``$EXECGATE_HOME/config.toml``: the user's settings, typed and validated.

Unknown keys and wrong types are errors naming the file and key, so a typo never silently
turns a protection off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from execgate import paths
from execgate.errors import ExecgateError
from execgate.gate.cleanenv import check_pattern

SANDBOX_MODES = ("read-only", "workspace-write", "off")


@dataclass(frozen=True)
class SandboxConfig:
    mode: str | None = None  # None: the front end's default (run: off, mcp: workspace-write)
    writable_roots: tuple[str, ...] = ()
    network: bool = False
    network_proxy: bool = False  # `network = "proxy"`
    strict_exec: bool = False
    exec_dirs: tuple[str, ...] = ()
    exclude_tmp: bool = False
    exclude_tmpdir: bool = False
    writable_git: bool = False


NETWORK_DEFAULTS = ("prompt", "deny", "allow")


@dataclass(frozen=True)
class NetworkConfig:
    """``[network]``: how the proxy of a ``network = "proxy"`` sandbox decides."""

    # Hosts no network_rule names; None: prompt where a human can be asked, else deny.
    default: str | None = None
    hosts_file: Path | None = None  # consulted before DNS (tests point names at loopback)


@dataclass(frozen=True)
class LogConfig:
    """``[log]``: the decision log (``execgate log``)."""

    enabled: bool = True
    max_bytes: int = 8 * 1024 * 1024  # size at which decisions.jsonl rotates
    keep: int = 4  # rotated files kept


OTEL_PROTOCOLS = ("http/protobuf", "grpc")


@dataclass(frozen=True)
class OtelConfig:
    """``[otel]``: export decisions as OTLP logs (``pip install 'execgate[otel]'``). Unset
    fields fall back to the standard ``OTEL_EXPORTER_OTLP_*`` variables."""

    endpoint: str | None = None
    protocol: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    include_arguments: bool = False  # argv, cwd and reasons; redacted by default


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    import_codex_rules: bool = True
    # The built-in default policy (policy/default.rules) is loaded under every other layer;
    # only an explicit `default_policy = false` turns it off.
    default_policy: bool = True
    # Escalated programs stay gated (their own execs are still decided by policy).
    gate_escalated: bool = True
    # Seconds a pending approval waits for a human before it is denied.
    approval_timeout: float = 300.0
    # Variables escalated programs never take from their caller, on top of the built-in list
    # (gate/cleanenv.py): names, or prefixes written NAME*.
    clean_escalated_env: tuple[str, ...] = ()
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    log: LogConfig = field(default_factory=LogConfig)
    otel: OtelConfig = field(default_factory=OtelConfig)
    # The tools `execgate mcp` offers (see MCP_TOOLS).
    tools: tuple[str, ...] = ("shell",)
    # Folders of agent skills whose <skill>/scripts/ programs always ask (None: the defaults,
    # $CODEX_HOME/skills and $EXECGATE_HOME/skills).
    skills_dirs: tuple[str, ...] | None = None


#: Tools `execgate mcp` can offer: the one-shot shell, and unified exec's pair.
MCP_TOOLS = ("shell", "exec_command", "write_stdin")


def check_tools(names: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``names`` without repeats; "unified" stands for exec_command and write_stdin.
    :class:`ExecgateError` for an unknown name or an empty list."""
    expanded: list[str] = []
    for name in names:
        for one in ("exec_command", "write_stdin") if name == "unified" else (name,):
            if one not in MCP_TOOLS:
                raise ExecgateError(
                    f"{where}: unknown tool {one!r} (known: {', '.join(MCP_TOOLS)}, unified)"
                )
            if one not in expanded:
                expanded.append(one)
    if not expanded:
        raise ExecgateError(f"{where}: name at least one tool")
    return tuple(expanded)


_TOML_NAMES = {dict: "table", list: "array", str: "string", bool: "boolean", int: "integer",
               float: "number"}  # fmt: skip


def _check(path: Path, key: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        names = " or ".join(_TOML_NAMES.get(k, k.__name__) for k in kinds)
        article = "an" if names[0] in "aeiou" else "a"
        raise ExecgateError(f"{path}: `{key}` must be {article} {names}, got {value!r}")
    return value


def _strings(path: Path, key: str, value: Any) -> tuple[str, ...]:
    items = _check(path, key, value, list)
    return tuple(_check(path, f"{key}[{i}]", item, str) for i, item in enumerate(items))


def _sandbox(path: Path, table: dict[str, Any]) -> SandboxConfig:
    known = {
        "mode",
        "writable_roots",
        "network",
        "strict_exec",
        "exec_dirs",
        "exclude_tmp",
        "exclude_tmpdir",
        "writable_git",
    }
    for key in table:
        if key not in known:
            raise ExecgateError(f"{path}: unknown key `sandbox.{key}`")
    mode = table.get("mode")
    if mode is not None and mode not in SANDBOX_MODES:
        raise ExecgateError(
            f"{path}: `sandbox.mode` must be one of {', '.join(SANDBOX_MODES)}, got {mode!r}"
        )
    flags: dict[str, bool] = {
        k: _check(path, f"sandbox.{k}", table[k], bool)
        for k in ("strict_exec", "exclude_tmp", "exclude_tmpdir", "writable_git")
        if k in table
    }
    network = table.get("network", False)
    if network == "proxy":
        flags["network_proxy"] = True
    elif isinstance(network, bool):
        flags["network"] = network
    else:
        raise ExecgateError(
            f'{path}: `sandbox.network` must be true, false or "proxy", got {network!r}'
        )
    return SandboxConfig(
        mode=mode,
        writable_roots=_strings(path, "sandbox.writable_roots", table.get("writable_roots", [])),
        exec_dirs=_strings(path, "sandbox.exec_dirs", table.get("exec_dirs", [])),
        **flags,
    )


def _network(path: Path, table: dict[str, Any]) -> NetworkConfig:
    for key in table:
        if key not in ("default", "hosts_file"):
            raise ExecgateError(f"{path}: unknown key `network.{key}`")
    default = table.get("default")
    if default is not None and default not in NETWORK_DEFAULTS:
        raise ExecgateError(
            f"{path}: `network.default` must be one of {', '.join(NETWORK_DEFAULTS)}, "
            f"got {default!r}"
        )
    hosts = table.get("hosts_file")
    if hosts is not None:
        hosts = Path(_check(path, "network.hosts_file", hosts, str)).expanduser()
        if not hosts.is_absolute():
            raise ExecgateError(f"{path}: `network.hosts_file` must be an absolute path")
    return NetworkConfig(default=default, hosts_file=hosts)


def _log(path: Path, table: dict[str, Any]) -> LogConfig:
    for key in table:
        if key not in ("enabled", "max_bytes", "keep"):
            raise ExecgateError(f"{path}: unknown key `log.{key}`")
    enabled = _check(path, "log.enabled", table.get("enabled", True), bool)
    max_bytes = _check(path, "log.max_bytes", table.get("max_bytes", LogConfig.max_bytes), int)
    keep = _check(path, "log.keep", table.get("keep", LogConfig.keep), int)
    if max_bytes < 4096 or keep < 0:
        raise ExecgateError(f"{path}: `log.max_bytes` must be at least 4096 and `log.keep` >= 0")
    return LogConfig(enabled=enabled, max_bytes=max_bytes, keep=keep)


def _otel(path: Path, table: dict[str, Any]) -> OtelConfig:
    for key in table:
        if key not in ("endpoint", "protocol", "headers", "include_arguments"):
            raise ExecgateError(f"{path}: unknown key `otel.{key}`")
    endpoint = table.get("endpoint")
    if endpoint is not None:
        _check(path, "otel.endpoint", endpoint, str)
        if not endpoint.startswith(("http://", "https://")):
            raise ExecgateError(f"{path}: `otel.endpoint` must be an http:// or https:// URL")
    protocol = table.get("protocol")
    if protocol is not None and protocol not in OTEL_PROTOCOLS:
        raise ExecgateError(
            f"{path}: `otel.protocol` must be one of {', '.join(OTEL_PROTOCOLS)}, got {protocol!r}"
        )
    headers = _check(path, "otel.headers", table.get("headers", {}), dict)
    return OtelConfig(
        endpoint=endpoint,
        protocol=protocol,
        headers=tuple(
            (k, _check(path, f"otel.headers.{k}", v, str)) for k, v in sorted(headers.items())
        ),
        include_arguments=_check(
            path, "otel.include_arguments", table.get("include_arguments", False), bool
        ),
    )


def load_config(path: Path | None = None) -> Config:
    """Read the config file (default ``$EXECGATE_HOME/config.toml``); absent means defaults."""
    path = path or paths.config_file()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise ExecgateError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ExecgateError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    import tomllib  # here: most start-ups have no config file to parse

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExecgateError(f"{path}: invalid TOML: {exc}") from None
    known = {
        "import_codex_rules",
        "default_policy",
        "gate_escalated",
        "approval_timeout",
        "clean_escalated_env",
        "sandbox",
        "network",
        "tools",
        "skills_dirs",
        "log",
        "otel",
    }
    for key in data:
        if key not in known:
            raise ExecgateError(f"{path}: unknown key `{key}`")
    timeout = _check(path, "approval_timeout", data.get("approval_timeout", 300.0), (int, float))
    if timeout <= 0:
        raise ExecgateError(f"{path}: `approval_timeout` must be positive")
    clean = _strings(path, "clean_escalated_env", data.get("clean_escalated_env", []))
    for i, pattern in enumerate(clean):
        problem = check_pattern(pattern)
        if problem:
            raise ExecgateError(f"{path}: `clean_escalated_env[{i}]` {problem}, got {pattern!r}")
    return Config(
        path=path,
        import_codex_rules=_check(
            path, "import_codex_rules", data.get("import_codex_rules", True), bool
        ),
        default_policy=_check(path, "default_policy", data.get("default_policy", True), bool),
        gate_escalated=_check(path, "gate_escalated", data.get("gate_escalated", True), bool),
        approval_timeout=float(timeout),
        clean_escalated_env=clean,
        sandbox=_sandbox(path, _check(path, "sandbox", data.get("sandbox", {}), dict)),
        network=_network(path, _check(path, "network", data.get("network", {}), dict)),
        skills_dirs=_strings(path, "skills_dirs", data["skills_dirs"])
        if "skills_dirs" in data
        else None,
        tools=check_tools(
            _strings(path, "tools", data.get("tools", ["shell"])), f"{path}: `tools`"
        ),
        log=_log(path, _check(path, "log", data.get("log", {}), dict)),
        otel=_otel(path, _check(path, "otel", data.get("otel", {}), dict)),
    )
