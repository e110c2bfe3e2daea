"""The API keys file and the tenants it makes: what a bad entry's error says (and never says), key
lookup on digests only, the rate bucket, and a re-read that keeps what is in flight."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from corral.router.edge.admin_access import is_loopback_host
from corral.router.edge.tenants import Tenant, Tenants
from corral.router.edge.tenants_file import TenantsFileError, TenantSpec, parse_tenants

KEY = "a-long-enough-secret-key"
HASHED = hashlib.sha256(KEY.encode()).hexdigest()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x", "the file must be a YAML list of tenants"),
        ("- [1, 2]", "entry 1: must be a mapping"),
        ("- key: " + KEY, "entry 1: field `name`"),
        ("- name: 'has space'\n  key: " + KEY, "entry 1: field `name`"),
        ("- name: a", "entry 1 (name 'a'): give exactly one of the fields `key` and `key_sha256`"),
        (f"- name: a\n  key: {KEY}\n  key_sha256: {HASHED}", "give exactly one"),
        ("- name: a\n  key: short", "entry 1 (name 'a'): field `key` must be a string of at least 16"),
        ("- name: a\n  key_sha256: abc", "field `key_sha256` must be 64 hex digits"),
        (f"- name: a\n  key: {KEY}\n  max_in_flight: 0", "field `max_in_flight` must be a positive integer"),
        (f"- name: a\n  key: {KEY}\n  max_in_flight: true", "field `max_in_flight`"),
        (f"- name: a\n  key: {KEY}\n  requests_per_minute: 1.5", "field `requests_per_minute`"),
        (f"- name: a\n  key: {KEY}\n  models: gpt", "field `models` must be a list of model names"),
        (f"- name: a\n  key: {KEY}\n  max_inflight: 3", "unknown field `max_inflight`"),
        (f"- name: a\n  key: {KEY}\n- name: a\n  key: {KEY}x", "entry 2 (name 'a'): field `name`"),
        (
            f"- name: a\n  key: {KEY}\n- name: b\n  key_sha256: {HASHED}",
            "entry 2 (name 'b'): its key is also",
        ),
        ("- name: a\n  key: [unclosed", "not valid YAML at line 2"),
    ],
)
def test_a_bad_entry_is_named_with_its_field_and_never_its_key(text: str, message: str) -> None:
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants(text, "keys.yaml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("keys.yaml")
    assert KEY not in str(caught.value) and HASHED not in str(caught.value)


def test_keys_are_held_as_digests_and_found_by_bearer_header() -> None:
    specs = parse_tenants(f"- name: a\n  key: {KEY}\n- name: b\n  key_sha256: '{'0' * 64}'\n", "f")
    assert KEY not in repr(specs) and all(len(s.key_sha256) == 32 for s in specs)
    tenants = Tenants(specs)
    found = tenants.lookup(f"Bearer {KEY}")
    assert found is not None and found.name == "a"
    assert tenants.lookup(f"bearer {KEY}") is found  # the scheme is case-insensitive
    for header in (None, "", KEY, f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {HASHED}", "Bearer "):
        assert tenants.lookup(header) is None


def test_the_rate_bucket_allows_a_minutes_worth_then_one_per_interval() -> None:
    tenant = Tenant(TenantSpec("a", b"k", requests_per_minute=3))
    now = 1000.0
    tenant._updated = now
    assert [tenant.take_token(now) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert tenant.take_token(now) == pytest.approx(20.0)  # 3 a minute: one every 20 s
    assert tenant.take_token(now + 10) == pytest.approx(10.0)
    assert tenant.take_token(now + 20) == 0.0
    unlimited = Tenant(TenantSpec("b", b"k"))
    assert all(unlimited.take_token(now) == 0.0 for _ in range(1000))


def test_models_and_in_flight_limits() -> None:
    tenant = Tenant(TenantSpec("a", b"k", max_in_flight=2, models=frozenset({"m1"})))
    assert tenant.serves("m1") and not tenant.serves("m2")
    assert not tenant.over_in_flight()
    tenant.in_flight = 2
    assert tenant.over_in_flight()
    assert Tenant(TenantSpec("b", b"k")).serves("anything")


def test_a_re_read_keeps_in_flight_and_a_bad_edit_keeps_the_tenants(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(f"- name: a\n  key: {KEY}\n  max_in_flight: 1\n")
    os.chmod(path, 0o600)
    tenants = Tenants.from_file(path)
    tenant = tenants.lookup(f"Bearer {KEY}")
    assert tenant is not None
    tenant.in_flight = 1
    path.write_text(f"- name: a\n  key: {KEY}-rotated\n  max_in_flight: 5\n")
    assert tenants.reload_if_changed()
    assert tenants.lookup(f"Bearer {KEY}") is None
    rotated = tenants.lookup(f"Bearer {KEY}-rotated")
    assert rotated is tenant and tenant.in_flight == 1 and tenant.max_in_flight == 5
    path.write_text("- name: a\n  key: oops\n")
    assert not tenants.reload_if_changed()
    assert tenants.file_errors == 1 and tenants.lookup(f"Bearer {KEY}-rotated") is tenant
    path.unlink()
    assert not tenants.reload_if_changed()
    assert tenants.file_errors == 2 and len(tenants) == 1
    assert not tenants.reload_if_changed()  # unchanged since: no second error


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("router.internal", False),
    ],
)
def test_which_listen_addresses_count_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
