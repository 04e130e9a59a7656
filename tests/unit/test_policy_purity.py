"""Policies import no infrastructure: the architecture rule, enforced."""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN = {"events", "workers", "sqlmodel", "sqlalchemy", "redis", "rq", "structlog",
             "fakeredis", "psycopg", "alembic", "random", "time", "datetime", "socket",
             "subprocess", "requests", "os"}
ALLOWED_INTERNAL = ("controlplane.policies",)
POLICIES = Path(__file__).resolve().parents[2] / "controlplane" / "policies"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_policies_import_no_infrastructure_clock_or_randomness() -> None:
    offenders = []
    files = sorted(POLICIES.rglob("*.py"))
    assert files, "no policy modules found"
    for path in files:
        for module in imported_modules(path):
            root = module.split(".")[0]
            if root in FORBIDDEN or root == "controlplane" and not module.startswith(ALLOWED_INTERNAL):
                offenders.append(f"{path.name}: {module}")
    assert offenders == []


def test_the_purity_check_catches_an_infrastructure_import(tmp_path: Path) -> None:
    sample = tmp_path / "bad.py"
    sample.write_text("from sqlalchemy import select\nimport redis.client\n")
    assert {"sqlalchemy", "redis.client"} <= imported_modules(sample)
