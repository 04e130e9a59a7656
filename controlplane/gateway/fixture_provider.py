"""The fixture provider: a call ledger and a fault script shared by every process on the machine.

The ledger is the provider's own record of every adapter invocation, kept outside the control
plane's store (a JSON-lines file appended under an exclusive lock), so a test can count calls
made by any worker process, including one killed mid-call. The fault script says what the next
matching call or final write does: refuse before sending, time out after sending, die after
sending, or fail the final write. `FLEET_GATEWAY_FIXTURE_DIR` names the directory; without it
each process uses a private temporary one.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

FIXTURE_DIR_ENV = "FLEET_GATEWAY_FIXTURE_DIR"
ADAPTER_FAULTS = ("refuse_before_send", "timeout_after_send", "crash_after_send")
PERSIST_FAULTS = ("persist_fails", "persist_and_mark_fail")


@dataclass(frozen=True)
class Fault:
    """One scripted fault; empty matchers match anything; it fires `times` times."""

    fault: str
    route_id: str | None = None
    tenant: str | None = None
    idempotency_key: str | None = None
    times: int = 1

    def __post_init__(self) -> None:
        if self.fault not in ADAPTER_FAULTS + PERSIST_FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}")
        if self.times < 1:
            raise ValueError("a fault fires at least once")

    def matches(self, route_id: str, tenant: str, idempotency_key: str) -> bool:
        return all(want is None or want == have for want, have in (
            (self.route_id, route_id), (self.tenant, tenant), (self.idempotency_key, idempotency_key)))


@dataclass(frozen=True)
class Behaviour:
    """How the fixture answers when no fault fires: latency, and output tokens as a share of the max."""

    latency_seconds: float = 0.0
    output_share: float = 1.0


class FixtureProvider:
    """The provider side of the fixture adapters: who called, and what goes wrong next."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ledger = directory / "calls.jsonl"
        self.faults_file = directory / "faults.json"
        self.behaviour_file = directory / "behaviour.json"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.directory / "lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def record_call(self, entry: dict[str, Any]) -> int:
        """Append one invocation to the ledger; returns how many calls its route has now had."""
        with self._locked():
            count = 1 + sum(1 for call in self._read_calls() if call["route_id"] == entry["route_id"])
            line = json.dumps({**entry, "route_call_number": count, "pid": os.getpid(),
                               "parent_pid": os.getppid()}, sort_keys=True)
            with open(self.ledger, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")  # flushed on close: it outlives the process
        return count

    def _read_calls(self) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text(encoding="utf-8").splitlines()
                if line.strip()]

    def calls(self, route_id: str | None = None, tenant: str | None = None,
              idempotency_key: str | None = None) -> list[dict[str, Any]]:
        """Every recorded invocation matching the filters, in call order."""
        with self._locked():
            return [call for call in self._read_calls()
                    if (route_id is None or call["route_id"] == route_id)
                    and (tenant is None or call["tenant"] == tenant)
                    and (idempotency_key is None or call["idempotency_key"] == idempotency_key)]

    def script(self, *faults: Fault) -> None:
        """Add faults after those already scripted."""
        with self._locked():
            self._write_faults(self._read_faults() + list(faults))

    def clear_faults(self) -> None:
        with self._locked():
            self._write_faults([])

    def take_fault(self, kinds: tuple[str, ...], route_id: str, tenant: str,
                   idempotency_key: str) -> str | None:
        """Consume the first scripted fault of `kinds` matching the call; None when none does."""
        with self._locked():
            faults = self._read_faults()
            for index, fault in enumerate(faults):
                if fault.fault in kinds and fault.matches(route_id, tenant, idempotency_key):
                    remaining = fault.times - 1
                    faults[index:index + 1] = [] if remaining == 0 else [
                        Fault(**{**asdict(fault), "times": remaining})]
                    self._write_faults(faults)
                    return fault.fault
        return None

    def _read_faults(self) -> list[Fault]:
        if not self.faults_file.exists():
            return []
        return [Fault(**item) for item in json.loads(self.faults_file.read_text(encoding="utf-8"))]

    def _write_faults(self, faults: list[Fault]) -> None:
        temporary = self.faults_file.with_suffix(".tmp")
        temporary.write_text(json.dumps([asdict(f) for f in faults]), encoding="utf-8")
        temporary.replace(self.faults_file)

    def set_behaviour(self, behaviour: Behaviour) -> None:
        self.behaviour_file.write_text(json.dumps(asdict(behaviour)), encoding="utf-8")

    def behaviour(self) -> Behaviour:
        if not self.behaviour_file.exists():
            return Behaviour()
        return Behaviour(**json.loads(self.behaviour_file.read_text(encoding="utf-8")))


@lru_cache(maxsize=8)
def _provider_at(directory: str) -> FixtureProvider:
    return FixtureProvider(Path(directory))


@lru_cache(maxsize=1)
def _private_directory(pid: int) -> str:
    return tempfile.mkdtemp(prefix=f"fleet-gateway-fixture-{pid}-")


def usable_fixture_dir() -> str | None:
    """The problem with `FLEET_GATEWAY_FIXTURE_DIR`, if set and not a directory this process can
    use (it is created if missing, as the provider would); None when it is fine or unset."""
    directory = os.environ.get(FIXTURE_DIR_ENV)
    if not directory:
        return None
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with open(Path(directory) / "lock", "a+"):
            pass
    except OSError as error:
        return f"{FIXTURE_DIR_ENV}: {directory} cannot be used as a directory " \
               f"({error.strerror or error})"
    return None


def fixture_provider() -> FixtureProvider:
    """The provider this process's fixture adapters talk to (see the module docstring)."""
    directory = os.environ.get(FIXTURE_DIR_ENV) or _private_directory(os.getpid())
    return _provider_at(directory)
