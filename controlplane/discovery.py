"""Find a package's domain modules, so registries assemble themselves without a shared list."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def domain_modules(package: ModuleType, attribute: str) -> list[ModuleType]:
    """Every submodule of `package` that defines `attribute`, in name order (deterministic)."""
    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if hasattr(module, attribute):
            found.append(module)
    return found
