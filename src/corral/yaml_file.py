"""A YAML file a person wrote (a bundle, a fleet file), read with the two errors they can fix: it cannot
be read, or it is not YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class YamlFileError(ValueError):
    """The file cannot be read or is not YAML; the message names the file and the cause."""


def read_yaml_file(path: Path, what: str) -> Any:
    """The parsed body of `path`, which the messages call "the `what` file"."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise YamlFileError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise YamlFileError(f"{path} is not valid YAML: {exc}") from None
