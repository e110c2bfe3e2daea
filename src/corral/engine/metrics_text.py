"""The one reader of Prometheus text exposition for engine (and router) `/metrics`: samples with their
name, labels and value, optionally only the names asked for.

Two modes, as the callers need them. Lenient (the router's scrape path): lines that are not samples of
the names asked for are skipped before any parsing, and a malformed line is skipped, never fatal; given
the answer's bytes, only the lines of the names asked for are found (a scan in C) and decoded.
Strict (the supervisor's evidence, the runbook's checks, doctor): every line is parsed and a
malformed one raises ValueError, so "the engine answered something that is not Prometheus text" is
seen. Labels are parsed only when read; escapes (\\\\, \\", \\n) are honoured.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class Sample:
    """One sample line: `name{labels} value [timestamp]`. `labels` is parsed on first read; from a lenient
    read, a malformed label set raises ValueError there."""

    __slots__ = ("_labels", "_raw", "name", "value")

    def __init__(self, name: str, value: float, raw_labels: str = "") -> None:
        self.name = name
        self.value = value
        self._raw = raw_labels
        self._labels: dict[str, str] | None = None

    @property
    def labels(self) -> dict[str, str]:
        if self._labels is None:
            self._labels = parse_labels(self._raw)
        return self._labels

    def __repr__(self) -> str:
        return f"Sample({self.name!r}, {self.value!r}, {self.labels!r})"


def parse_labels(raw: str) -> dict[str, str]:
    """`a="1",b="x\\"y"` → {"a": "1", "b": 'x"y'}; raises ValueError on anything else."""
    labels: dict[str, str] = {}
    i, n = 0, len(raw)
    while i < n:
        eq = raw.find("=", i)
        if eq < 0:
            if raw[i:].strip(" ,"):
                raise ValueError(f"label without a value: {raw[i:]!r}")
            break
        key = raw[i:eq].strip(" ,")
        if not key or raw[eq + 1 : eq + 2] != '"':
            raise ValueError(f"malformed labels: {raw!r}")
        j = eq + 2
        end = raw.find('"', j)
        if end >= 0 and raw.find("\\", j, end) < 0:
            labels[key] = raw[j:end]
            i = end + 1
            continue
        chars: list[str] = []
        while True:
            if j >= n:
                raise ValueError(f"unterminated label value: {raw!r}")
            c = raw[j]
            if c == '"':
                break
            if c == "\\" and j + 1 < n:
                j += 1
                c = _ESCAPES.get(raw[j], "\\" + raw[j])
            chars.append(c)
            j += 1
        labels[key] = "".join(chars)
        i = j + 1
    return labels


class LineTooLong(ValueError):
    """A line the caller asked for is longer than its `max_line_bytes`."""


def samples(
    text: str | bytes,
    names: Collection[str] | None = None,
    strict: bool = False,
    max_line_bytes: int | None = None,
) -> Iterator[Sample]:
    """The samples of `text` (only those named in `names`, when given), in order. Bytes are read as
    UTF-8; lenient and named, they are never decoded whole, and a line of a name asked for that is longer
    than `max_line_bytes` raises LineTooLong before it is decoded."""
    if names is not None and not strict:
        if isinstance(text, bytes):
            yield from _find_bytes(text, names, max_line_bytes)
        else:
            yield from _find(text, names)
        return
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    for line in text.split("\n"):
        line = line.strip()
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ", 0, brace) if brace >= 0 else line.find(" ")
        labelled = brace >= 0 and space < 0
        name = line[:brace] if labelled else line if space < 0 else line[:space]
        if names is not None and name not in names:  # strict here: the whole text must still be valid
            _sample(line, name, *_split(line, brace, labelled))
            continue
        raw, rest = _split(line, brace, labelled)
        sample = _sample(line, name, raw, rest) if strict else _lenient(name, raw, rest)
        if sample is not None:
            yield sample


def _find(text: str | bytes, names: Collection[str]) -> Iterator[Sample]:
    """Lenient and named: each name is searched for in the whole text (a scan in C) instead of looking
    at every line, which is what makes the router's scrape cheap; the samples are put back in text order.
    In bytes, only the lines found are decoded."""
    if isinstance(text, bytes):
        yield from _find_bytes(text, names)
        return
    found: list[tuple[int, Sample]] = []
    for name in names:
        at = text.find(name)
        while at >= 0:
            after = at + len(name)
            end = text.find("\n", after)
            end = len(text) if end < 0 else end
            if (at == 0 or text[at - 1] == "\n") and text[after : after + 1] in ("{", " "):
                line = text[at:end]
                labelled = line[len(name)] == "{"
                sample = _lenient(name, *_split(line, len(name), labelled))
                if sample is not None:
                    found.append((at, sample))
            at = text.find(name, end)
    if len(names) > 1:
        found.sort(key=lambda pair: pair[0])
    for _, sample in found:
        yield sample


def _find_bytes(data: bytes, names: Collection[str], max_line: int | None = None) -> Iterator[Sample]:
    """`_find` over bytes: a sample line starts the page or follows a newline, so the scan looks for
    the newline and the name together; a found line is decoded alone (an engine's page is ~50 KB, the
    four lines routing reads ~300 bytes)."""
    found: list[tuple[int, Sample]] = []
    for name in names:
        raw_name = name.encode()
        size = len(raw_name)
        needle = b"\n" + raw_name
        at = 0 if data.startswith(raw_name) else _line_start(data, needle, 0)
        while at >= 0:
            after = at + size
            end = data.find(b"\n", after)
            end = len(data) if end < 0 else end
            if max_line is not None and end - at > max_line:
                raise LineTooLong(f"a {name} line of {end - at} bytes (at most {max_line})")
            if data[after : after + 1] in (b"{", b" "):
                line = data[at:end].decode(errors="replace").rstrip("\r")
                sample = _lenient(name, *_split(line, size, line[size] == "{"))
                if sample is not None:
                    found.append((at, sample))
            at = _line_start(data, needle, end)
    if len(names) > 1:
        found.sort(key=lambda pair: pair[0])
    for _, sample in found:
        yield sample


def _line_start(data: bytes, needle: bytes, start: int) -> int:
    """Where the next line beginning with `needle`'s name starts (`needle` is a newline and the name)."""
    at = data.find(needle, start)
    return at if at < 0 else at + 1


def _split(line: str, brace: int, labelled: bool) -> tuple[str, str]:
    """(the text between the braces, what follows: value and timestamp)."""
    if not labelled:
        space = line.find(" ")
        return "", "" if space < 0 else line[space:]
    close = line.rfind("}")  # the value and timestamp after the labels never hold "}"
    return (line[brace + 1 : close], line[close + 1 :]) if close > brace else ("", "")


def _sample(line: str, name: str, raw: str, rest: str) -> Sample:
    fields = rest.split()
    if not name or not fields or len(fields) > 2 or "_" in fields[0]:
        raise ValueError(f"not a Prometheus sample line: {line!r}")
    sample = Sample(name, float(fields[0]), raw)
    sample.labels  # noqa: B018 - strict: parse the labels now, so a malformed set raises here
    return sample


def _lenient(name: str, raw: str, rest: str) -> Sample | None:
    fields = rest.split(maxsplit=1)
    if not fields:
        return None
    try:
        return Sample(name, float(fields[0]), raw)
    except ValueError:
        return None
