"""`corral sleep|wake|…` keep the operation's change record: written under `$XDG_STATE_HOME/corral` as
`<kind>-<supervisor port>.json` with its path printed; a record off the schema, or none (an older
supervisor), is said so and nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from corral.contracts.operations import OperationRecord
from corral.contracts.records import ChangeRecord
from corral.supervisor.commands.runbook_run import change_record_file, keep_change_record

URL = "http://127.0.0.1:9181"


def finished(result: dict[str, Any] | None) -> OperationRecord:
    return OperationRecord(
        operation_id="sleep-1", kind="sleep", status="succeeded", started=1.0, result=result
    )


def test_the_record_is_written_where_its_kind_and_port_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    record = ChangeRecord(kind="sleep", id="sleep-1", started=1.0, finished=2.0, outcome="succeeded")
    keep_change_record(URL, finished({"steps": [], "change_record": record.to_file()}))
    path = tmp_path / "corral" / "sleep-9181.json"
    # the printed answer is the contract: what the person who ran the command reads
    assert f"change record: {path}" in capsys.readouterr().out
    assert ChangeRecord.model_validate(orjson.loads(path.read_bytes())) == record
    assert change_record_file("wake", "https://sup.example") == tmp_path / "corral" / "wake-443.json"


def test_a_record_off_the_schema_or_missing_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    keep_change_record(URL, finished({"steps": [], "change_record": {"kind": "sleep"}}))
    # the printed answer is the contract: what the person who ran the command reads
    assert "does not match the schema" in capsys.readouterr().out
    keep_change_record(URL, finished({"steps": []}))
    assert "no change record in the operation's result" in capsys.readouterr().out
    assert not (tmp_path / "corral").exists()


def test_the_observe_limit_the_options_take_is_the_contracts_limit() -> None:
    """`runbook_ops` keeps its own copy so that `--help` need not import the wire models."""
    from corral.contracts.operations import OBSERVE_SECONDS_MAX
    from corral.supervisor.commands import runbook_ops

    assert runbook_ops.OBSERVE_SECONDS_MAX == OBSERVE_SECONDS_MAX
