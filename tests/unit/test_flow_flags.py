"""`corral router --flow-*` flags: `--flow-band-ttl PRIORITY=SECONDS` is bounded (no `int()` of a long
digit run, a priority within the bands, seconds > 0), and a bad one stops the start naming the flag."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from corral.router.cli import router
from corral.router.flow.flags import parse_band_ttls


def test_band_ttls_are_read() -> None:
    assert parse_band_ttls(("10=5", " -1 = 0.5 ", "+3=120")) == {10: 5.0, -1: 0.5, 3: 120.0}


@pytest.mark.parametrize(
    "value",
    [
        "10",
        "=5",
        "10=",
        "ten=5",
        "10=5s",
        "10=-5",
        "10=0",
        "1001=5",
        "-1001=5",
        "9" * 5000 + "=5",
        "10=" + "9" * 5000,
    ],
)
def test_bad_band_ttls_are_refused_without_echoing_a_long_value(value: str) -> None:
    with pytest.raises(ValueError, match="--flow-band-ttl") as caught:
        parse_band_ttls((value,))
    assert len(str(caught.value)) < 300


def test_a_bad_band_ttl_stops_the_router_naming_the_flag() -> None:
    result = CliRunner().invoke(router, ["--backend", "http://127.0.0.1:9", "--flow-band-ttl", "x=1"])
    assert result.exit_code == 2 and "--flow-band-ttl" in result.output
