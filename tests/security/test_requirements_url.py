"""Admin requirements from a URL, against a real loopback HTTP server: signed documents,
tampered caches, bad and missing signatures, and HTTP caching (max-age, ETag / 304)."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from execgate.policy import Decision, PolicyError, load_layered_policy
from execgate.policy.requirements import load_requirements, requirements_cache_dir

from .conftest import FORBID_MARKER, Homes, Keys, Server


def settings(homes: Homes, server: Server, *, key: str | None = None, extra: str = "") -> None:
    lines = [f'requirements_url = "{server.url}"', "requirements_timeout = 2"]
    if key is not None:
        lines.append(f"requirements_public_key = '''{key}'''")
    homes.requirements("\n".join([*lines, extra, ""]))


def signed(server: Server, keys: Keys, document: str = FORBID_MARKER) -> None:
    server.served.document = document.encode()
    server.served.signature = keys.sign(server.served.document)


def marker_decision(homes: Homes) -> tuple[Decision | None, str | None]:
    loaded = load_layered_policy(homes.work)
    return loaded.policy.evaluate(["marker"]).decision, loaded.fail_closed_reason


def cached_document() -> bytes:
    (path,) = requirements_cache_dir().glob("*.toml")
    return path.read_bytes()


@pytest.mark.parametrize("form", ["base64", "pem"])
def test_signed_document_applies(homes: Homes, server: Server, keys: Keys, form: str) -> None:
    signed(server, keys)
    settings(homes, server, key=keys.public_base64 if form == "base64" else keys.public_pem)
    assert marker_decision(homes) == (Decision.FORBIDDEN, None)


def test_no_refetch_within_max_age(homes: Homes, server: Server, keys: Keys) -> None:
    signed(server, keys)
    server.served.cache_control = "max-age=3600"
    settings(homes, server, key=keys.public_base64)
    for _ in range(3):
        assert marker_decision(homes) == (Decision.FORBIDDEN, None)
    assert server.served.count(".toml") == 1  # the document was asked for once
    assert server.served.count(".sig") == 1


def test_stale_copy_is_revalidated_with_etag(homes: Homes, server: Server, keys: Keys) -> None:
    signed(server, keys)
    server.served.cache_control = "max-age=0"
    settings(homes, server, key=keys.public_base64)
    assert marker_decision(homes) == (Decision.FORBIDDEN, None)
    assert marker_decision(homes) == (Decision.FORBIDDEN, None)
    assert server.served.count(".toml", 200) == 1
    assert server.served.count(".toml", 304) == 1  # If-None-Match matched: no body resent
    assert server.served.count(".sig") == 1


def test_refresh_interval_bounds_a_long_max_age(homes: Homes, server: Server, keys: Keys) -> None:
    signed(server, keys)
    server.served.cache_control = "max-age=86400"
    settings(homes, server, key=keys.public_base64, extra="requirements_refresh_interval = 1e-9")
    marker_decision(homes)
    marker_decision(homes)
    assert server.served.count(".toml", 304) == 1


def test_new_document_replaces_the_copy(homes: Homes, server: Server, keys: Keys) -> None:
    signed(server, keys)
    server.served.cache_control = "no-cache"
    settings(homes, server, key=keys.public_base64)
    assert marker_decision(homes)[0] is Decision.FORBIDDEN
    signed(server, keys, FORBID_MARKER.replace("forbidden", "prompt"))
    server.served.etag = '"v2"'
    assert marker_decision(homes)[0] is Decision.PROMPT


def test_tampered_cache_is_refused_and_refetched(homes: Homes, server: Server, keys: Keys) -> None:
    signed(server, keys)
    settings(homes, server, key=keys.public_base64)
    marker_decision(homes)
    (path,) = requirements_cache_dir().glob("*.toml")
    path.write_text("")  # the user drops the admin's rule from the fresh copy
    assert marker_decision(homes) == (Decision.FORBIDDEN, None)
    assert server.served.count(".toml", 200) == 2  # the edited copy was not trusted
    assert cached_document() == FORBID_MARKER.encode()


def test_tampered_cache_with_the_url_down_fails_closed(
    homes: Homes, server: Server, keys: Keys
) -> None:
    signed(server, keys)
    server.served.cache_control = "no-cache"
    settings(homes, server, key=keys.public_base64)
    marker_decision(homes)
    (path,) = requirements_cache_dir().glob("*.toml")
    path.write_text("")
    server.stop()
    _decision, reason = marker_decision(homes)
    assert reason is not None
    assert f"admin requirements from {server.url} could not be fetched" in reason
    assert f"the cached copy {path} was refused (its signature does not verify)" in reason
    assert "requirements_public_key is set" in reason


def test_cache_edited_along_with_its_signature_is_refused(
    homes: Homes, server: Server, keys: Keys
) -> None:
    signed(server, keys)
    settings(homes, server, key=keys.public_base64)
    marker_decision(homes)
    (path,) = requirements_cache_dir().glob("*.toml")
    path.write_text("")
    path.with_suffix(".sig").unlink()  # and the signature removed: unsigned
    server.stop()
    reason = marker_decision(homes)[1]
    assert reason is not None and "was refused (it is not signed)" in reason


def test_verified_cache_survives_the_url_going_down(
    homes: Homes, server: Server, keys: Keys
) -> None:
    signed(server, keys)
    server.served.cache_control = "no-cache"
    settings(homes, server, key=keys.public_base64)
    marker_decision(homes)
    server.stop()
    loaded = load_layered_policy(homes.work)
    assert loaded.fail_closed_reason is None
    assert loaded.policy.evaluate(["marker"]).decision is Decision.FORBIDDEN
    assert "using the copy cached" in loaded.warnings[0]


def test_bad_signature_is_refused(homes: Homes, server: Server, keys: Keys) -> None:
    other = Keys(Ed25519PrivateKey.generate())
    server.served.signature = other.sign(server.served.document)
    settings(homes, server, key=keys.public_base64)
    _decision, reason = marker_decision(homes)
    assert reason == (
        f"admin requirements from {server.url} could not be fetched (the document was refused: "
        "its signature does not verify) and there is no cached copy, so every command is denied "
        "(requirements_public_key is set)"
    )
    assert list(requirements_cache_dir().glob("*")) == []  # nothing refused is kept


def test_document_changed_in_transit_is_refused(homes: Homes, server: Server, keys: Keys) -> None:
    signed(server, keys)
    server.served.document = b"# nothing forbidden here\n"  # the signature is the old one's
    settings(homes, server, key=keys.public_base64)
    reason = marker_decision(homes)[1]
    assert reason is not None and "its signature does not verify" in reason


def test_unsigned_content_is_refused_when_a_key_is_set(
    homes: Homes, server: Server, keys: Keys
) -> None:
    server.served.signature = None  # .sig answers 404
    settings(homes, server, key=keys.public_base64)
    reason = marker_decision(homes)[1]
    assert reason is not None
    assert (
        f"the document was refused: its signature {server.url}.sig could not be fetched "
        "(HTTP status 404)" in reason
    )


def test_garbage_signature_is_refused(homes: Homes, server: Server, keys: Keys) -> None:
    server.served.signature = b"not a signature"
    settings(homes, server, key=keys.public_base64)
    reason = marker_decision(homes)[1]
    assert reason is not None and "the signature is not 64 bytes" in reason


def test_fail_open_cannot_be_combined_with_a_key(homes: Homes, server: Server, keys: Keys) -> None:
    settings(homes, server, key=keys.public_base64, extra='on_requirements_error = "fail-open"')
    with pytest.raises(PolicyError, match="signed requirements always fail closed") as caught:
        load_requirements()
    assert str(caught.value).startswith(str(homes.system / "requirements.toml"))


@pytest.mark.parametrize("key", ["not base64!", "AAAA", "-----BEGIN PUBLIC KEY-----\nxx\n"])
def test_bad_key_is_an_error_naming_the_file(homes: Homes, server: Server, key: str) -> None:
    settings(homes, server, key=key)
    with pytest.raises(PolicyError, match="`requirements_public_key` must be an Ed25519") as caught:
        load_requirements()
    assert str(caught.value).startswith(str(homes.system / "requirements.toml"))
    assert "\n" not in str(caught.value).strip()


def test_cache_metadata_holds_the_etag(homes: Homes, server: Server, keys: Keys) -> None:
    signed(server, keys)
    settings(homes, server, key=keys.public_base64)
    marker_decision(homes)
    (meta,) = requirements_cache_dir().glob("*.json")
    assert json.loads(meta.read_text())["etag"] == '"v1"'


def test_edited_cache_metadata_neither_crashes_nor_skips_the_check(
    homes: Homes, server: Server, keys: Keys
) -> None:
    signed(server, keys)
    server.served.cache_control = "no-cache"
    settings(homes, server, key=keys.public_base64)
    marker_decision(homes)
    (meta,) = requirements_cache_dir().glob("*.json")
    meta.write_text('{"etag": "\\"v1\\"", "fetched": 1e300, "max_age": 1e300}')  # "fresh forever"
    server.stop()
    loaded = load_layered_policy(homes.work)  # a time from the future is stale: ask, then warn
    assert loaded.policy.evaluate(["marker"]).decision is Decision.FORBIDDEN
    assert "using the copy cached at an unknown time" in loaded.warnings[0]
