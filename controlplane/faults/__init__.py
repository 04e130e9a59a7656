"""Fault injection for the reliability suite and report: seeded runs of the mixed scenario on
real workers, with a fault injected, and the invariants every run must keep."""

from __future__ import annotations

from controlplane.faults.harness import FaultSetupError, FaultTarget
from controlplane.faults.invariants import (
    InvariantReport,
    assert_fleet_invariants,
    check_fleet_invariants,
)
from controlplane.faults.kinds import (
    DATABASES,
    FAULT_KINDS,
    FaultKind,
    FaultRun,
    planned_runs,
    run_fault,
    seed_for,
)

__all__ = ["DATABASES", "FAULT_KINDS", "FaultKind", "FaultRun", "FaultSetupError", "FaultTarget",
           "InvariantReport", "assert_fleet_invariants", "check_fleet_invariants", "planned_runs",
           "run_fault", "seed_for"]
