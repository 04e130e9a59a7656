"""`replay`'s text report names what differs: the rows, and the decisions whose outcome changed
first, with a count of any it does not list."""

from __future__ import annotations

from typing import Any

from controlplane.cli.replay_cmd import SHOWN_DRIFTS, _render


def drift(position: int, recorded: str, rederived: str) -> dict[str, Any]:
    return {"position": position, "command_id": f"c{position}", "older_rules": False,
            "recorded": {"outcome": recorded}, "rederived": {"outcome": rederived},
            "changed_fields": ["reasons"] if recorded == rederived else ["outcome", "reasons"],
            "rules_version": 1, "current_rules_version": 1}


def test_a_what_if_lists_changed_outcomes_first_and_counts_the_rest() -> None:
    drifts = [drift(i, "admit", "admit") for i in range(1, 58)] + [
        drift(58, "queue", "shed"), drift(59, "admit", "queue")]
    text = _render({"decisions_checked": 100, "drifts": drifts, "what_if": True, "position": 99})
    lines = text.splitlines()
    assert lines[0] == "what-if: 100 decision(s) re-derived, 59 would differ (2 in outcome)"
    assert lines[1:3] == ["  #58 c58: queue -> shed (outcome, reasons)",
                          "  #59 c59: admit -> queue (outcome, reasons)"]
    assert len(lines) == 1 + SHOWN_DRIFTS + 1
    assert lines[-1] == f"  … and {59 - SHOWN_DRIFTS} more (--json lists every one)"


def test_projection_differences_name_their_rows() -> None:
    differences = [{"projection": "node", "key": "h1"}, {"projection": "rollout", "key": "ro"}]
    text = _render({"projection_differences": differences, "position": 9})
    assert text == ("projections: 2 difference(s) from the live state (node/h1, rollout/ro; "
                    "--json shows both values)")
