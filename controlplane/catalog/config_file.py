"""A model config read as a JSON object: from a mapping, a file, or a directory's config.json.

A file is read no further than `MAX_CONFIG_BYTES`, and a non-finite number in it is refused, so
what comes back is a finite JSON object or a `CatalogError` saying why not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controlplane.catalog.errors import CatalogError

# A model's config.json is kilobytes; a file is read no further than this.
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def load_config(source: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """Return a config as a dict from a mapping, a JSON file, or a directory with config.json."""
    if isinstance(source, Mapping):
        return dict(source)
    path = config_path(source)
    if path.is_dir():
        raise CatalogError("config_missing", "config",
                           f"directory {str(source)!r} has no config.json")
    try:
        with path.open("rb") as handle:  # bounded: a FIFO or /dev/zero never ends
            raw = handle.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_CONFIG_BYTES} bytes")
        loaded = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise CatalogError("config_unreadable", "config",
                           f"cannot read model config {str(path)!r}: "
                           f"{str(error).split(';')[0]}") from None
    except RecursionError:
        raise CatalogError("config_unreadable", "config",
                           f"cannot read model config {str(path)!r}: nested too deeply") from None
    if not isinstance(loaded, dict):
        raise CatalogError("config_not_an_object", "config", "a model config must be a JSON object")
    return loaded


def config_path(source: str | Path) -> Path:
    """The file a config is read from: `source` (`~` expanded), or its config.json when it is a
    directory."""
    path = Path(source).expanduser()
    return path / "config.json" if path.is_dir() and (path / "config.json").exists() else path


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in config")
