"""The one redaction list: which engine flags take a secret, which JSON keys inside a JSON-valued flag
hold one, and which environment variables are secrets; and the masking every place that shows, logs or
records an engine's command or environment applies (the supervisor's log lines, `/v1/state`, the oplog,
the engine's relayed output, change and rollout records, `corral k8s render`).

Facts behind the list: vLLM's `--api-key` (repeatable values) and `--hf-token` (the Hugging Face bearer
token; bare, it means "the stored login") take secrets on the command line; `--model-loader-extra-config`
carries the Tensorizer loader's `s3_access_key_id` / `s3_secret_access_key`, and connector settings in
`--kv-transfer-config`'s `kv_connector_extra_config` may carry credentials, so every JSON-valued argument
is searched, nested keys included. The environment names are vLLM's (VLLM_API_KEY), Hugging Face's
(HF_TOKEN, HUGGING_FACE_HUB_TOKEN), AWS's and S3's (AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
S3_SECRET_ACCESS_KEY, ...), and any name with a secret's word in it: a false positive masks a harmless
value, a false negative leaks one, so the words are matched generously.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MASK = "<redacted>"

# vLLM flags whose value is a secret. `--api-key` takes one or more values (vLLM: nargs="+")
SECRET_FLAGS: frozenset[str] = frozenset({"--api-key", "--hf-token"})
MULTI_VALUE_FLAGS: frozenset[str] = frozenset({"--api-key"})

# Flags refused in an engine command Corral starts or renders: the value would sit in the command line,
# readable in `ps`, the pod spec and every record. What to do instead, by flag.
REFUSED_FLAGS: dict[str, str] = {
    "--hf-token": "a token on the command line is readable by anyone who can list processes or read "
    "the Deployment; give it to the engine as HF_TOKEN in its environment (in Kubernetes: "
    "engine.secret_env HF_TOKEN from a Secret)",
}

# Named secrets (exact names), and the words that make any other name a secret. Names are compared
# upper-cased with '-' read as '_', so JSON keys (s3_secret_access_key) and env names match alike.
SECRET_NAMES: frozenset[str] = frozenset(
    {
        "VLLM_API_KEY",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HUGGINGFACE_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "S3_ACCESS_KEY_ID",
        "S3_SECRET_ACCESS_KEY",
        "AZURE_STORAGE_KEY",
        "AZURE_CLIENT_SECRET",
        "GOOGLE_APPLICATION_CREDENTIALS_JSON",
        # OpenTelemetry exporters' headers: often a collector's credentials (docs/tracing.md)
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
    }
)
_SECRET_WORDS = re.compile(
    r"(SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|APIKEY|API_KEY|ACCESS_KEY|PRIVATE_KEY)"
)
_SECRET_PARTS = frozenset({"TOKEN", "AUTH", "KEY", "PWD"})  # whole '_'-separated parts: not MAX_TOKENS
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NOT_SECRET = re.compile(r"(_|^)(FILE|PATH|DIR|URL|ENDPOINT|REGION|KEYFILE)$")


def is_secret_name(name: str) -> bool:
    """True when an environment variable or JSON key of this name holds a secret (see the module)."""
    upper = _CAMEL.sub("_", name).upper().replace("-", "_")  # sessionToken reads as SESSION_TOKEN
    if upper in SECRET_NAMES:
        return True
    if _NOT_SECRET.search(upper):  # the path to a secret is not the secret: HF_TOKEN_PATH, *_KEY_FILE
        return False
    return bool(_SECRET_WORDS.search(upper)) or not _SECRET_PARTS.isdisjoint(upper.split("_"))


def _redact_json_value(value: Any, found: list[str]) -> Any:
    if isinstance(value, dict):
        shown: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and is_secret_name(key) and item not in (None, "", False):
                found.extend(_leaves(item))
                shown[key] = MASK
            else:
                shown[key] = _redact_json_value(item, found)
        return shown
    if isinstance(value, list):
        return [_redact_json_value(item, found) for item in value]
    return value


def _leaves(value: Any) -> list[str]:
    """Every scalar under `value` as text: what a masked key held, to be masked in free text too."""
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [] if value is None or isinstance(value, bool) else [str(value)]


def _json_secrets(text: str) -> tuple[str, list[str]]:
    """`text` with the values of its secret keys masked, and those values; unchanged (byte for byte)
    when it is not a JSON object or array or holds no secret key."""
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")):
        return text, []
    try:
        parsed = json.loads(text)
    except ValueError:
        return text, []
    found: list[str] = []
    shown = _redact_json_value(parsed, found)
    if not found:
        return text, []
    return json.dumps(shown, separators=(",", ":")), found


def redact_json_text(text: str) -> str:
    """A JSON-valued argument with every secret key's value masked, nested keys included; other text
    (and JSON without a secret) is returned unchanged, so fingerprints of secretless commands stay."""
    return _json_secrets(text)[0]


def _flag_of(arg: str) -> tuple[str, bool]:
    """The flag an argument names and whether it carries its value (`--flag=value`)."""
    flag, eq, _ = arg.partition("=")
    return flag, bool(eq)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """The command with every secret masked: the values of SECRET_FLAGS (`--flag value`, `--flag=value`,
    every value of a bare `--api-key`) and secret keys inside JSON-valued arguments (either form). What
    logs, the oplog, `/v1/state`, records and rendered manifests show."""
    shown: list[str] = []
    taking: str | None = None  # the bare secret flag whose values follow
    for arg in argv:
        if taking is not None and (shown[-1] == taking or not arg.startswith("-")):
            if taking in MULTI_VALUE_FLAGS or shown[-1] == taking:
                shown.append(MASK)
                continue
        taking = None
        flag, inline = _flag_of(arg)
        if flag in SECRET_FLAGS:
            if inline:
                shown.append(f"{flag}={MASK}")
            else:
                taking = flag
                shown.append(arg)
            continue
        if inline and flag.startswith("-"):
            value = arg.partition("=")[2]
            shown.append(f"{flag}={redact_json_text(value)}")
        else:
            shown.append(redact_json_text(arg))
    return shown


def secret_values(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """The secret values in a command and an environment, as text: what a `Redactor` masks in the
    engine's own output (vLLM prints its non-default arguments, secrets among them). Environment values
    under 4 characters are left out: masking every "1" would make the output unreadable, and hide nothing."""
    values: list[str] = []
    for original, shown in zip(argv, redact_argv(argv), strict=True):
        if original == shown:
            continue
        flag, inline = _flag_of(original)
        if shown == MASK:  # a value of a bare secret flag
            values.append(original)
        elif flag in SECRET_FLAGS and inline:
            values.append(original.partition("=")[2])
        else:  # a JSON value with secret keys, alone or as --flag=JSON
            values.extend(
                _json_secrets(original.partition("=")[2] if inline and flag.startswith("-") else original)[1]
            )
    for name, value in (environ or {}).items():
        if is_secret_name(name) and len(value) >= 4:
            values.append(value)
    return [v for v in values if v and v != MASK]


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment with the values of secret names masked (names and other values kept)."""
    return {name: MASK if is_secret_name(name) and value else value for name, value in env.items()}


def refused_flag(argv: Iterable[str]) -> tuple[str, str] | None:
    """The first argument of REFUSED_FLAGS that carries a value, and what to do instead; None when
    none does. A bare `--hf-token` (the stored login, no value) is not refused."""
    args = list(argv)
    for i, arg in enumerate(args):
        flag, inline = _flag_of(arg)
        if flag not in REFUSED_FLAGS:
            continue
        if inline or (i + 1 < len(args) and not args[i + 1].startswith("-")):
            return flag, REFUSED_FLAGS[flag]
    return None


class Redactor:
    """Masks known secret values in free text (the engine's output lines echo its arguments)."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # longest first, so a secret that contains another is masked whole
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text
