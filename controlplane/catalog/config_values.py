"""A model config's values, validated: an error names the config key and, for a file, the file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.catalog.errors import CatalogError
from controlplane.policies.memory import MAX_COUNT


class ConfigValueError(CatalogError):
    """A value of a model config that cannot be used: `field` is its key (nested keys dotted,
    `vision_config.hidden_size`) and `config_file` the file it was read from (None for a config
    given as a mapping), so an error names the key and the file, never a command-line flag."""

    def __init__(self, code: str, field: str, message: str, config_file: str | None) -> None:
        super().__init__(code, field, message)
        self.config_file = config_file

    def as_dict(self) -> dict[str, str]:
        located = {"config_key": self.field}
        return {**super().as_dict(), **located,
                **({"config_file": self.config_file} if self.config_file else {})}


def config_count(config: Mapping[str, Any], key: str, default: Any = ...) -> Any:
    """`config[key]` as a positive integer no larger than `MAX_COUNT`; `default` when it is
    absent or null, and a `CatalogError` naming `key` when there is no default."""
    if config.get(key) is None:
        if default is ...:
            raise CatalogError("config_field_missing", key, f"config has no {key}")
        return default
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CatalogError("config_field_invalid", key,
                           f"config {key} must be a positive integer, got {value!r}")
    if value > MAX_COUNT:  # beyond any real model: its sizes would not be finite figures
        raise CatalogError("config_field_out_of_range", key,
                           f"config {key} must be at most {MAX_COUNT:.0e}, got {value}")
    return value
