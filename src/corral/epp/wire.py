"""The endpoint-picker protocol on Envoy's ext_proc messages (Gateway API Inference Extension, proposal
004): the names it defines, reading what the gateway sends (headers, the subset hint, the endpoint that
served), each bounded, and building what the picker answers (the pick as a header and as `envoy.lb`
dynamic metadata, bodies handed back in streamed chunks, an ImmediateResponse)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

# Where the gateway may name the endpoints a pick must come from (filter metadata of a request).
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
# Where the pick goes: a request header, and the same value in `envoy.lb` dynamic metadata.
DESTINATION_NAMESPACE = "envoy.lb"
DESTINATION_KEY = "x-gateway-destination-endpoint"
# Where the gateway says which endpoint of the list served the request (metadata of the response phases).
SERVED_KEY = "x-gateway-destination-endpoint-served"
# P/D: the prefill engine for the decode engine's side (as llm-d's routing sidecar reads it).
PREFILL_HEADER = "x-prefiller-host-port"
# A body handed back in streamed mode goes in chunks under the 64 KiB some Envoy builds allow per message.
STREAMED_CHUNK_BYTES = 62_000

# Bounds on what the gateway sends (docs/security.md, "Endpoint picker").
MAX_HEADERS = 256  # headers of one request or response
MAX_HEADER_BYTES = 128 * 1024  # their keys and values together
MAX_SUBSET_ENTRIES = 4096  # endpoints in one subset hint
MAX_ENDPOINT_CHARS = 64  # one `ip:port` ("[v6]:port" fits)


class WireError(ValueError):
    """What the gateway sent breaks the protocol or a bound: the message says which value and why."""


def read_headers(headers: ext_proc.HttpHeaders) -> dict[str, str]:
    """Header name (lower case) -> value, the last of a repeated name; `raw_value` (bytes) wins over
    `value`. Over MAX_HEADERS or MAX_HEADER_BYTES, or a value that is not UTF-8: WireError."""
    entries = headers.headers.headers
    if len(entries) > MAX_HEADERS:
        raise WireError(f"{len(entries)} headers; the picker reads at most {MAX_HEADERS}")
    read: dict[str, str] = {}
    size = 0
    for entry in entries:
        raw = entry.raw_value
        size += len(entry.key) + (len(raw) if raw else len(entry.value))
        if size > MAX_HEADER_BYTES:
            raise WireError(f"headers over {MAX_HEADER_BYTES} bytes in all")
        try:
            value = raw.decode() if raw else entry.value
        except UnicodeDecodeError:
            raise WireError(f"header {entry.key[:64]!r}: the value is not UTF-8") from None
        read[entry.key.lower()] = value
    return read


def subset_hint(request: ext_proc.ProcessingRequest) -> frozenset[str] | None:
    """The `ip:port`s the gateway allows for this request, or None when it sets no subset (every
    endpoint of the pool). A list of strings or one comma-separated string, as gateways write either;
    an entry that is no `ip:port` can match no endpoint and is dropped. Over MAX_SUBSET_ENTRIES, or a
    value of another type: WireError."""
    namespace = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if namespace is None or SUBSET_KEY not in namespace.fields:
        return None
    value = namespace.fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        items: Iterable[str] = [value.string_value]
    elif kind == "list_value":
        if len(value.list_value.values) > MAX_SUBSET_ENTRIES:
            raise WireError(f"{SUBSET_KEY}: over {MAX_SUBSET_ENTRIES} entries")
        items = []
        for item in value.list_value.values:
            if item.WhichOneof("kind") != "string_value":
                raise WireError(f"{SUBSET_KEY}: an entry is a {item.WhichOneof('kind')}, not a string")
            items.append(item.string_value)
    else:
        raise WireError(f"{SUBSET_KEY}: a {kind}, not a list of `ip:port` strings")
    allowed: set[str] = set()
    for text in items:
        if len(text) > MAX_SUBSET_ENTRIES * (MAX_ENDPOINT_CHARS + 1):
            raise WireError(f"{SUBSET_KEY}: over {MAX_SUBSET_ENTRIES} entries")
        for part in text.split(","):
            entry = part.strip()
            if entry and len(entry) <= MAX_ENDPOINT_CHARS:
                allowed.add(entry)
        if len(allowed) > MAX_SUBSET_ENTRIES:
            raise WireError(f"{SUBSET_KEY}: over {MAX_SUBSET_ENTRIES} entries")
    return frozenset(allowed)


def served_endpoint(request: ext_proc.ProcessingRequest) -> str | None:
    """The `ip:port` the gateway reports as having served the request, when it reports one."""
    namespace = request.metadata_context.filter_metadata.get(DESTINATION_NAMESPACE)
    if namespace is None or SERVED_KEY not in namespace.fields:
        return None
    value = namespace.fields[SERVED_KEY]
    if value.WhichOneof("kind") != "string_value" or len(value.string_value) > MAX_ENDPOINT_CHARS:
        return None
    served: str = value.string_value
    return served.strip()


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def picked(
    endpoints: list[str],
    headers: Mapping[str, str],
    remove: Iterable[str] = (),
    phase: str = "request_headers",
) -> ext_proc.ProcessingResponse:
    """The request-headers answer that carries a pick: `x-gateway-destination-endpoint` as a header and in
        `envoy.lb` dynamic metadata (the same value: primary first, then the fallbacks, comma-separated),
        `headers` set, `remove` removed, and the route cache cleared so the gateway routes by the pick. In
    buffered mode the answer to the body (`phase` request_body) carries it."""
    value = ",".join(endpoints)
    mutation = ext_proc.HeaderMutation(
        set_headers=[_header(DESTINATION_KEY, value), *(_header(k, v) for k, v in headers.items())],
        remove_headers=list(remove),
    )
    metadata = struct_pb2.Struct()
    metadata.fields[DESTINATION_NAMESPACE].struct_value.fields[DESTINATION_KEY].string_value = value
    response = ext_proc.ProcessingResponse(dynamic_metadata=metadata)
    common = getattr(response, phase).response
    common.header_mutation.CopyFrom(mutation)
    common.clear_route_cache = True
    return response


def headers_continue(phase: str) -> ext_proc.ProcessingResponse:
    """Let the headers of `phase` (request_headers, response_headers) go on unchanged."""
    response = ext_proc.ProcessingResponse()
    getattr(response, phase).SetInParent()
    return response


def body_continue(phase: str) -> ext_proc.ProcessingResponse:
    """Let a buffered body of `phase` (request_body, response_body) go on unchanged."""
    response = ext_proc.ProcessingResponse()
    getattr(response, phase).SetInParent()
    return response


def body_chunks(phase: str, body: bytes, end_of_stream: bool) -> Iterator[ext_proc.ProcessingResponse]:
    """In full-duplex streamed mode the gateway forwards only the body the picker hands back: `body` in
    chunks of at most STREAMED_CHUNK_BYTES, the last one marked `end_of_stream` when the body ends."""
    starts = range(0, len(body), STREAMED_CHUNK_BYTES) if body else range(1)
    last = starts[-1]
    for start in starts:
        chunk = ext_proc.StreamedBodyResponse(
            body=body[start : start + STREAMED_CHUNK_BYTES], end_of_stream=end_of_stream and start == last
        )
        response = ext_proc.ProcessingResponse()
        getattr(response, phase).response.body_mutation.streamed_response.CopyFrom(chunk)
        yield response


def immediate(
    status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()
) -> ext_proc.ProcessingResponse:
    """Answer the client now, without an upstream: `status` (an HTTP status), `body`, `headers`."""
    return ext_proc.ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=ext_proc.HeaderMutation(set_headers=[_header(k, v) for k, v in headers]),
            body=body,
        )
    )
