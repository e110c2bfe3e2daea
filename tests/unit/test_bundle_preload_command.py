"""A bundle's `preload_command:` (issue 29 item 5: a bundle is its engine and its weight-cache daemon): read
from the file, refused in plain words when it cannot be a daemon's command, masked in records, and part
of the bundle fingerprint."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.bundle_spec import BundleError, BundleSpec, bundle_from_json, bundle_record, unrecorded_secrets
from corral.fleet.local.up import up
from corral.supervisor.checks.bundle import bundle_from

DAEMON = ["vllm", "preload", "--model", "m", "--weight-cache-health-port", "8100"]
ENGINE = ["vllm", "serve", "m", "--load-format", "ipc_cache"]


def test_a_bundle_names_its_daemon_and_the_host_one_is_the_default() -> None:
    own = bundle_from_json({"name": "v2", "preload_command": DAEMON}, "v2.yaml")
    assert own.preload_argv(("host-daemon",)) == tuple(DAEMON)
    assert own.to_json()["preload_command"] == DAEMON
    assert BundleSpec(name="v1").preload_argv(("host-daemon",)) == ("host-daemon",)
    assert "preload_command" not in BundleSpec(name="v1").to_json()


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("vllm preload", r"preload_command: write a list of strings"),
        (["", "preload"], r"preload_command: .*the first word is the daemon's program"),
        (["vllm", "pre\0load"], r"NUL byte"),
        ([*DAEMON, "--load-format", "ipc_cache"], r"the daemon loads the weights from disk"),
        ([*DAEMON, "--load-format=ipc_cache"], r"the daemon loads the weights from disk"),
        ([*DAEMON, "--hf-token", "hf_abc"], r"--hf-token with a value is refused"),
    ],
)
def test_a_command_no_daemon_can_run_is_refused_naming_the_field(command: object, message: str) -> None:
    with pytest.raises(BundleError, match=message) as caught:
        bundle_from_json({"name": "v2", "preload_command": command}, "v2.yaml")
    assert str(caught.value).startswith("v2.yaml: preload_command")
    assert "hf_abc" not in str(caught.value)


def test_a_secret_in_the_daemons_command_is_masked_in_records_and_named_on_the_way_back() -> None:
    bundle = BundleSpec(
        name="v2", preload_command=(*DAEMON, "--model-loader-extra-config", '{"s3_secret": "x"}')
    )
    kept = bundle_record(bundle)
    assert '"x"' not in str(kept["preload_command"])
    assert "preload_command" in unrecorded_secrets(bundle_from_json(kept, "record"))


def test_the_daemon_is_part_of_the_fingerprint() -> None:
    alone = bundle_from(ENGINE, "0.31.0", [])
    with_daemon = bundle_from(ENGINE, "0.31.0", [], preload=DAEMON)
    other_daemon = bundle_from(ENGINE, "0.31.0", [], preload=[*DAEMON, "--dtype", "float16"])
    assert len({alone.fingerprint, with_daemon.fingerprint, other_daemon.fingerprint}) == 3
    # what the daemon serves, not where it listens: engines of one group, each with its own daemon
    # (`corral up --preload`), share a fingerprint; a `sh -c` wrapper is read through
    elsewhere = [*DAEMON[:4], "--weight-cache-health-port", "8200", "--socket-path", "/s"]
    assert bundle_from(ENGINE, "0.31.0", [], preload=elsewhere).fingerprint == with_daemon.fingerprint
    wrapped = ["sh", "-c", "exec vllm preload --model m --dtype float16"]
    assert bundle_from(ENGINE, "0.31.0", [], preload=wrapped).fingerprint == other_daemon.fingerprint
    # an engine without a daemon keeps the fingerprint it had
    assert "preload" not in alone.parts and alone.fingerprint == bundle_from(ENGINE, "0.31.0", []).fingerprint


WORDS = st.lists(st.text(alphabet=string.printable + "\0é", max_size=12), max_size=8)


@settings(deadline=None, max_examples=200)
@given(WORDS)
def test_any_words_are_a_bundle_or_a_refusal_naming_preload_command(words: list[str]) -> None:
    try:
        bundle = bundle_from_json({"name": "v2", "preload_command": words}, "v2.yaml")
    except BundleError as exc:
        assert "preload_command" in str(exc)
        return
    assert list(bundle.preload_command) == words
    assert not any("\0" in w for w in words) and (not words or words[0].strip())
    # what a record keeps reads back as a bundle (secrets masked, then named)
    bundle_from_json(bundle_record(bundle), "record")


def test_corral_up_refuses_a_bundle_daemon_it_would_not_start(tmp_path: Path) -> None:
    """A local fleet gives each engine its own daemon (`--preload`) or none: the field is refused."""
    bundle = tmp_path / "b.yaml"
    bundle.write_text('name: b\npreload_command: ["vllm", "preload", "--model", "m"]\n')
    done = CliRunner().invoke(up, ["--bundle", str(bundle)])
    assert done.exit_code == 2, done.output
    assert "a local fleet runs no bundle's daemon" in done.output


def test_the_engines_socket_location_is_not_part_of_its_fingerprint() -> None:
    """Two engines of one bundle on one host load from two daemons on two sockets and serve the same."""

    def engine(config: str) -> str:
        argv = ["vllm", "serve", "m", "--model-loader-extra-config", config]
        return bundle_from(argv, "0.31.0", []).fingerprint

    here = engine('{"socket_path": "/a/wc.sock", "mode": "zero_copy"}')
    assert engine('{"mode": "zero_copy", "socket_path": "/b/wc.sock"}') == here
    assert engine('{"socket_dir": "/c", "mode": "zero_copy"}') == here
    assert engine('{"socket_path": "/a/wc.sock", "mode": "copy"}') != here  # how it loads is
    assert engine("not json") != here
