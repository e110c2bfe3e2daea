"""`corral sim --render-ms-per-token`: the API server's rendering and tokenizing time per prompt token
(before the engine core counts the request; tests/integration/test_drain_gate_open.py uses it). A value
that is not a number of milliseconds in its range is refused naming the option, before anything runs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from corral.cli import main


@pytest.mark.parametrize("bad", ["-1", "1001", "nan", "soon", ""])
def test_a_bad_render_time_is_refused_naming_the_option(bad: str) -> None:
    result = CliRunner().invoke(main, ["sim", "--port", "1", "--render-ms-per-token", bad])
    assert result.exit_code == 2, result.output
    assert "--render-ms-per-token" in result.output
