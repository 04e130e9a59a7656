"""What every benchmark reports to `bench/run_all.py`: figures beside their same-run references.

Each script takes `--figures-out PATH` and writes its figures there as JSON; `run_all.py`
collects them into one table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One line of the suite's summary: our number beside the reference measured in the same run.

    `ratio` is ours / reference; `goal` says which ratio (or number) the issue asks for and
    `met` whether this run reached it (None: no goal, or not measured).
    """

    figure: str
    ours: float
    reference: float | None
    unit: str
    reference_name: str
    goal: str = ""
    met: bool | None = None

    @property
    def ratio(self) -> float | None:
        return self.ours / self.reference if self.reference else None

    def as_json(self) -> dict[str, Any]:
        return {"figure": self.figure, "ours": self.ours, "reference": self.reference,
                "unit": self.unit, "reference_name": self.reference_name,
                "ratio": None if self.ratio is None else round(self.ratio, 4),
                "goal": self.goal, "met": self.met}


def add_figures_argument(parser: Any) -> None:
    """`--figures-out PATH`: where `bench/run_all.py` collects each script's figures."""
    parser.add_argument("--figures-out", type=Path, default=None,
                        help="also write this run's figures as JSON to PATH (for run_all.py)")


def write_figures(path: Path | None, figures: Sequence[Figure]) -> None:
    if path is not None:
        path.write_text(json.dumps([f.as_json() for f in figures], indent=2))
