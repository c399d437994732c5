"""The variables an escalated program never takes from its caller.

An escalated program runs outside the sandbox on the caller's behalf. Many programs run other
code or read other configuration because of a variable in their environment — ``git`` runs
``core.fsmonitor`` from ``GIT_CONFIG_*``, ``GIT_EXTERNAL_DIFF`` and its pager; the loader loads
``LD_AUDIT``; ``bash`` sources ``BASH_ENV``; Python imports from ``PYTHONPATH`` — so a gated
caller could make an allowed program run its code unconfined. For each variable listed here the
escalated program gets the value the session itself started with (the user's, from the front
end's environment), or nothing; never the caller's (docs/policy.md, "The escalated
environment"). ``NAME*`` stands for every variable whose name starts with ``NAME``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Kept in the order of docs/policy.md's table.
BUILT_IN: tuple[str, ...] = (
    # the dynamic loader and glibc
    "LD_*", "GLIBC_TUNABLES", "GCONV_PATH", "HOSTALIASES", "LOCPATH", "NLSPATH",
    # where every program finds its configuration
    "HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS",
    # where it finds the programs it starts by name: a rule names none of the sandbox's own, so
    # they would run unconfined, as the escalated program does (tar -z's gzip)
    "PATH",
    # git
    "GIT_CONFIG*", "GIT_EXTERNAL_DIFF", "GIT_DIFF_OPTS", "GIT_SSH*", "GIT_EXEC_PATH",
    "GIT_ASKPASS", "GIT_PAGER", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR", "GIT_TEMPLATE_DIR",
    "GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_PROXY_COMMAND", "GIT_TRACE*", "GIT_ALLOW_PROTOCOL",
    "SSH_ASKPASS", "SSH_ASKPASS_REQUIRE",
    # programs that other programs start
    "PAGER", "MANPAGER", "EDITOR", "VISUAL", "LESSOPEN", "LESSCLOSE", "BROWSER",
    # options read as if given on the command line (tar's --checkpoint-action=exec=, rsync's
    # and cvs's remote shell, go's -toolexec): a rule's fixed arguments would not hold
    "TAR_OPTIONS", "RSYNC_RSH", "RSYNC_CONNECT_PROG", "CVS_RSH", "GOFLAGS",
    # where package installers take packages from (an index, a folder of the sandbox's wheels)
    "PIP_*", "UV_*",
    # shells
    "BASH_ENV", "ENV", "BASH_FUNC_*", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND",
    "ZDOTDIR",
    # language runtimes
    "PYTHON*", "NODE_OPTIONS", "NODE_PATH", "PERL5LIB", "PERL5OPT", "PERLLIB", "PERL5DB",
    "RUBYOPT", "RUBYLIB", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH",
    "DOTNET_STARTUP_HOOKS", "LUA_INIT*", "LUA_PATH*", "LUA_CPATH*", "TCLLIBPATH", "PHPRC",
    "PHP_INI_SCAN_DIR",
    # build tools and libraries that load modules
    "MAKEFLAGS", "MAKEFILES", "GNUMAKEFLAGS", "npm_config_*", "NPM_CONFIG_*", "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER", "CARGO_BUILD_RUSTC_WRAPPER", "OPENSSL_CONF", "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class CleanedVariables:
    """Exact names and name prefixes (``NAME*``) of the variables an escalated program never
    takes from its caller."""

    names: frozenset[str]
    prefixes: tuple[str, ...]

    def covers(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)


def cleaned_variables(extra: Iterable[str] = ()) -> CleanedVariables:
    """The built-in list plus ``extra`` (``clean_escalated_env`` in config.toml)."""
    names: set[str] = set()
    prefixes: list[str] = []
    for pattern in (*BUILT_IN, *extra):
        if pattern.endswith("*"):
            if pattern[:-1] not in prefixes:
                prefixes.append(pattern[:-1])
        else:
            names.add(pattern)
    return CleanedVariables(frozenset(names), tuple(prefixes))


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` is not a variable name or ``PREFIX*`` (None when it is)."""
    body = pattern[:-1] if pattern.endswith("*") else pattern
    if not body or "=" in body or "*" in body or "\0" in body:
        return "must be a variable name or a name prefix followed by *"
    return None
