"""Pure decision policies: functions of (command, state, parameters) -> decision.

Nothing in this package may import infrastructure (events, workers, sqlmodel, sqlalchemy, redis,
rq, structlog); `tests/unit/test_policy_purity.py` enforces it. No clock, no randomness, no I/O.
"""
