"""The roles of a local prefill/decode fleet (`corral up --prefill N --decode M`): how many serving
groups of each role it starts, and what a prefill or decode engine's command line and its supervisor's
add to the bundle (vLLM's NIXL connector with `kv_both`, the role itself told to the supervisor)."""

from __future__ import annotations

from collections.abc import Sequence

# Every engine of a P/D fleet runs the same connector config, as vLLM's own NIXL examples run both
# sides with kv_both: the proxy, not the engine, decides which leg a request is. So a prefill and a
# decode engine of one bundle have one bundle fingerprint, and the role is the supervisor's `--role`.
DEFAULT_KV_TRANSFER_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
_KV_FLAG = "--kv-transfer-config"


class RoleCountError(ValueError):
    """A P/D fleet's counts do not make whole serving groups of each role; the message says which."""


def role_groups(engines: int, prefill: int, decode: int, group_size: int) -> list[tuple[str, int]]:
    """(role, serving groups) to start: `prefill` and `decode` groups for a P/D fleet (both above 0),
    else `engines` engines that do both."""
    if not prefill and not decode:
        if engines % group_size:
            raise RoleCountError(
                f"--engines {engines} is not a multiple of --group-size {group_size}; "
                f"use e.g. --engines {engines - engines % group_size or group_size}"
            )
        return [("both", engines // group_size)]
    if not prefill or not decode:
        given, missing = ("--prefill", "--decode") if prefill else ("--decode", "--prefill")
        raise RoleCountError(
            f"{given} without {missing}: a disaggregated fleet needs engines of both roles; "
            f"add {missing} N, or use --engines N for engines that do both"
        )
    for flag, count in (("--prefill", prefill), ("--decode", decode)):
        if count % group_size:
            raise RoleCountError(
                f"{flag} {count} is not a multiple of --group-size {group_size}: each role runs whole "
                f"serving groups; use e.g. {flag} {count - count % group_size or group_size}"
            )
    return [("prefill", prefill // group_size), ("decode", decode // group_size)]


def engine_args_for(role: str, engine_args: Sequence[str]) -> list[str]:
    """A bundle's engine args as an engine of `role` runs them: a prefill or decode engine gets the
    default connector config unless the bundle names its own."""
    args = list(engine_args)
    if role == "both" or any(a == _KV_FLAG or a.startswith(_KV_FLAG + "=") for a in args):
        return args
    return [*args, _KV_FLAG, DEFAULT_KV_TRANSFER_CONFIG]


def supervisor_args_for(role: str) -> list[str]:
    """What the engine's supervisor is told of its role (it publishes it to routers)."""
    return [] if role == "both" else ["--role", role]


def role_marker(role: str) -> str:
    """The backends-file token for `role` (none for an engine that does both)."""
    return "" if role == "both" else f" role={role}"
