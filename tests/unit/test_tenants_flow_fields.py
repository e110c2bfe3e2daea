"""The API keys file's flow-control fields (priority, max_priority, weight, deadline_ms): bounded
whole numbers, each bad value refused naming the entry and the field, never the key."""

from __future__ import annotations

import pytest

from corral.router.edge.tenants_file import TenantsFileError, parse_tenants

KEY = "a-tenant-key-0123456789"


def entry(**fields: object) -> str:
    lines = ["- name: team-a", f"  key: {KEY}"]
    lines += [f"  {k}: {v}" for k, v in fields.items()]
    return "\n".join(lines) + "\n"


def test_fields_are_read_with_their_defaults() -> None:
    (plain,) = parse_tenants(entry(), "keys.yaml")
    assert (plain.priority, plain.max_priority, plain.weight, plain.deadline_ms) == (0, None, 1, None)
    (spec,) = parse_tenants(entry(priority=-5, max_priority=10, weight=3, deadline_ms=2500), "keys.yaml")
    assert (spec.priority, spec.max_priority, spec.weight, spec.deadline_ms) == (-5, 10, 3, 2500)


@pytest.mark.parametrize(
    "field,value",
    [
        ("priority", "1001"),
        ("priority", "-1001"),
        ("priority", "high"),
        ("priority", "true"),
        ("priority", "1.5"),
        ("priority", "[1]"),
        ("max_priority", "{a: 1}"),
        ("weight", "0"),
        ("weight", "1001"),
        ("weight", "-1"),
        ("deadline_ms", "0"),
        ("deadline_ms", "86400001"),
        ("deadline_ms", "'100'"),
    ],
)
def test_bad_values_name_the_entry_and_field(field: str, value: str) -> None:
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants(entry(**{field: value}), "keys.yaml")
    message = str(caught.value)
    assert "entry 1 (name 'team-a')" in message and f"`{field}`" in message
    assert KEY not in message and len(message) < 300  # a 5,000-digit value is not echoed whole


def test_an_unknown_field_lists_the_flow_fields() -> None:
    with pytest.raises(TenantsFileError, match=r"unknown field `priorty`.*max_priority.*priority.*weight"):
        parse_tenants(entry(priorty=1), "keys.yaml")


@pytest.mark.parametrize("field", ["priority", "weight", "max_in_flight"])
def test_a_number_of_thousands_of_digits_is_refused_not_raised(field: str) -> None:
    # yaml.safe_load int()s it and Python raises ValueError past 4,300 digits: a crash at start and a
    # re-read that died, before this
    with pytest.raises(TenantsFileError, match="thousands of digits") as caught:
        parse_tenants(entry(**{field: "9" * 5000}), "keys.yaml")
    assert KEY not in str(caught.value) and len(str(caught.value)) < 300
