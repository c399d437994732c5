"""Admin requirements: the file, Codex's messages, the URL against a real loopback HTTP server
(success, cache reuse, timeout, fail-closed, fail-open)."""

# ruff: noqa: E501  (rules texts and Codex's messages are quoted verbatim)

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from execgate.policy import Decision, PolicyError, load_layered_policy
from execgate.policy.requirements import (
    Fetched,
    load_requirements,
    parse_requirement_rules,
    read_settings,
    requirements_cache_dir,
)

from .conftest import CliResult, Env, run_cli

FORBID_RM = """
[rules]
prefix_rules = [
  { pattern = [ { token = "rm" }, { any_of = ["-rf", "-fr"] } ], decision = "forbidden", justification = "no recursive deletes" },
  { pattern = [ { any_of = ["npm", "pnpm"] }, { token = "publish" } ], decision = "prompt" },
]
"""


@dataclass
class Served:
    """What the loopback server answers; tests change it between requests."""

    status: int = 200
    body: str = FORBID_RM
    hang: bool = False
    requests: int = 0
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def server() -> Iterator[tuple[str, Served]]:
    served = Served()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.requests += 1
            if served.hang:  # never answer in time: the client's timeout must fire
                served.release.wait(30)
                return
            data = served.body.encode()
            self.send_response(served.status)
            self.send_header("Content-Length", str(len(data)))
            # Revalidate every time: these tests count on each load asking the server.
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/requirements.toml", served
    finally:
        served.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def settings_file(env: Env, url: str, mode: str = "fail-closed", extra: str = "") -> None:
    env.write(
        env.system / "requirements.toml",
        f'requirements_url = "{url}"\nrequirements_timeout = 0.5\n'
        f'on_requirements_error = "{mode}"\n{extra}',
    )


# --- the file -------------------------------------------------------------------------------


def test_local_requirements_are_applied_last_and_tighten(env: Env) -> None:
    env.write(env.execgate_home / "rules" / "u.rules", 'prefix_rule(["rm"], "allow")\n')
    env.write(env.system / "requirements.toml", FORBID_RM)
    loaded = load_layered_policy(env.work)
    evaluation = loaded.policy.evaluate(["rm", "-fr", "x"])
    assert evaluation.decision is Decision.FORBIDDEN
    assert [m.decision for m in evaluation.matches] == [Decision.ALLOW, Decision.FORBIDDEN]
    assert evaluation.reason() == "`rm -fr x` rejected: no recursive deletes"
    assert str(evaluation.matches[1].source).endswith("requirements.toml#rules.prefix_rules[0]")
    assert loaded.policy.evaluate(["pnpm", "publish"]).decision is Decision.PROMPT
    assert [s.layer for s in loaded.sources] == ["default", "user", "requirements"]


def test_codex_requirements_rules_apply_too(env: Env) -> None:
    env.write(
        env.codex_system / "requirements.toml",
        'allowed_sandbox_modes = ["read-only"]\n' + FORBID_RM,
    )
    assert (
        load_layered_policy(env.work).policy.evaluate(["rm", "-rf"]).decision is Decision.FORBIDDEN
    )


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("prefix_rules = []", "rules prefix_rules cannot be empty"),
        (
            'prefix_rules = [{ pattern = [], decision = "prompt" }]',
            "rules prefix_rule at index 0 has an empty pattern",
        ),
        (
            'prefix_rules = [{ pattern = [{ token = "" }], decision = "prompt" }]',
            "rules prefix_rule at index 0 has an invalid pattern token at index 0: token cannot be empty",
        ),
        (
            'prefix_rules = [{ pattern = [{ token = "a" }, { any_of = [] }], decision = "prompt" }]',
            "rules prefix_rule at index 0 has an invalid pattern token at index 1: any_of cannot be empty",
        ),
        (
            'prefix_rules = [{ pattern = [{ any_of = ["a", " "] }], decision = "prompt" }]',
            "rules prefix_rule at index 0 has an invalid pattern token at index 0: any_of cannot include empty tokens",
        ),
        (
            'prefix_rules = [{ pattern = [{ token = "a", any_of = ["b"] }], decision = "prompt" }]',
            "rules prefix_rule at index 0 has an invalid pattern token at index 0: set either token or any_of, not both",
        ),
        (
            'prefix_rules = [{ pattern = [{}], decision = "prompt" }]',
            "rules prefix_rule at index 0 has an invalid pattern token at index 0: set either token or any_of",
        ),
        (
            'prefix_rules = [{ pattern = [{ token = "a" }] }]',
            "rules prefix_rule at index 0 is missing a decision",
        ),
        (
            'prefix_rules = [{ pattern = [{ token = "a" }], decision = "prompt", justification = " " }]',
            "rules prefix_rule at index 0 has an empty justification",
        ),
        (
            'prefix_rules = [{ pattern = [{ token = "a" }], decision = "prompt" }, { pattern = [{ token = "a" }], decision = "allow" }]',
            "rules prefix_rule at index 1 has decision 'allow', which is not permitted in "
            "requirements.toml: Codex merges these rules with other config and uses the most "
            "restrictive result (use 'prompt', 'prompt-user', or 'forbidden')",
        ),
    ],
)
def test_requirement_validation_messages(env: Env, rules: str, message: str) -> None:
    path = env.write(env.system / "requirements.toml", f"[rules]\n{rules}\n")
    with pytest.raises(PolicyError) as caught:
        read_settings()
    assert str(caught.value) == f"{path}: {message}"


def test_prompt_user_counts_as_prompt() -> None:
    document = {
        "rules": {"prefix_rules": [{"pattern": [{"token": "x"}], "decision": "prompt-user"}]}
    }
    assert parse_requirement_rules(document, "r")[0].decision is Decision.PROMPT


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus = 1", "unknown key `bogus`"),
        ('requirements_url = "ftp://x"', "`requirements_url` must be an http:// or https:// URL"),
        ('requirements_url = "https://x"\nrequirements_timeout = 0', "must be a positive number"),
        ('on_requirements_error = "ignore"', "`on_requirements_error` must be"),
        ("[rules", "invalid TOML"),
    ],
)
def test_settings_errors_stop_start_up(env: Env, text: str, message: str) -> None:
    env.write(env.system / "requirements.toml", text + "\n")
    with pytest.raises(PolicyError, match=message.replace("(", r"\(")):
        load_layered_policy(env.work)


# --- the URL --------------------------------------------------------------------------------


def test_url_rules_are_fetched_and_cached(env: Env, server: tuple[str, Served]) -> None:
    url, served = server
    settings_file(env, url)
    loaded = load_layered_policy(env.work)
    assert loaded.fail_closed_reason is None and loaded.warnings == []
    assert loaded.policy.evaluate(["rm", "-rf", "/"]).decision is Decision.FORBIDDEN
    assert served.requests == 1
    cached = list(requirements_cache_dir().glob("*.toml"))
    assert len(cached) == 1 and cached[0].read_text() == FORBID_RM
    source = loaded.policy.evaluate(["rm", "-rf"]).matches[-1].source
    assert str(source) == f"{url}#rules.prefix_rules[0]"


def test_cache_is_reused_when_the_server_fails(env: Env, server: tuple[str, Served]) -> None:
    url, served = server
    settings_file(env, url)
    load_layered_policy(env.work)
    served.status, served.body = 500, "oops"
    loaded = load_layered_policy(env.work)
    assert loaded.fail_closed_reason is None
    assert loaded.policy.evaluate(["rm", "-rf"]).decision is Decision.FORBIDDEN
    assert len(loaded.warnings) == 1
    assert (
        f"could not fetch requirements from {url} (HTTP status 500); using the copy cached"
        in (loaded.warnings[0])
    )


def test_invalid_document_counts_as_unavailable(env: Env, server: tuple[str, Served]) -> None:
    url, served = server
    served.body = '[rules]\nprefix_rules = [{ pattern = [{ token = "a" }], decision = "allow" }]\n'
    settings_file(env, url)
    loaded = load_layered_policy(env.work)
    assert loaded.fail_closed_reason is not None
    assert "decision 'allow'" in loaded.fail_closed_reason
    assert list(requirements_cache_dir().glob("*.toml")) == []


def test_timeout_without_cache_fails_closed(env: Env, server: tuple[str, Served]) -> None:
    url, served = server
    served.hang = True
    settings_file(env, url)
    loaded = load_layered_policy(env.work)
    assert loaded.fail_closed_reason == (
        f"admin requirements from {url} could not be fetched (timed out) and there is no cached "
        'copy, so every command is denied (on_requirements_error = "fail-closed")'
    )


def test_timeout_with_cache_uses_the_cache(env: Env, server: tuple[str, Served]) -> None:
    url, served = server
    settings_file(env, url)
    load_layered_policy(env.work)
    served.hang = True
    loaded = load_layered_policy(env.work)
    assert loaded.fail_closed_reason is None
    assert "(timed out); using the copy cached" in loaded.warnings[0]
    assert loaded.policy.evaluate(["npm", "publish"]).decision is Decision.PROMPT


def test_fail_open_warns_and_goes_on(env: Env, server: tuple[str, Served]) -> None:
    url, served = server
    served.status = 404
    settings_file(env, url, mode="fail-open", extra=FORBID_RM.replace("rm", "shred"))
    loaded = load_layered_policy(env.work)
    assert loaded.fail_closed_reason is None
    assert loaded.warnings == [
        f"could not fetch requirements from {url} (HTTP status 404) and there is no cached "
        'copy; continuing without them (on_requirements_error = "fail-open")'
    ]
    # the local rules still apply, the URL's are missing
    assert loaded.policy.evaluate(["shred", "-rf"]).decision is Decision.FORBIDDEN
    assert loaded.policy.evaluate(["rm", "-rf"]).decision is None


def test_unreachable_server_fails_closed(env: Env) -> None:
    settings_file(env, "http://127.0.0.1:9/requirements.toml")  # discard port: refused
    reason = load_layered_policy(env.work).fail_closed_reason
    assert reason is not None and "could not be fetched" in reason


def test_check_refuses_when_failed_closed(env: Env, server: tuple[str, Served]) -> None:
    url, served = server
    served.status = 503
    settings_file(env, url)
    result: CliResult = run_cli("check", "--", "ls")
    assert result.status == 1
    assert result.err.startswith("execgate: error: admin requirements from")
    assert result.out == ""


def test_fetcher_can_be_replaced(env: Env) -> None:
    settings_file(env, "https://example.invalid/r.toml")
    result = load_requirements(fetch=lambda url, timeout, etag: Fetched(FORBID_RM.encode()))
    assert [r.program for r in result.rules] == ["rm", "npm", "pnpm"]
