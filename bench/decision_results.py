"""The decisions benchmark's results: runs, floors, and the ratios and goals it reports."""

from __future__ import annotations

from typing import Any

from bench.common import Measurement, format_table
from bench.figures import Figure

EMBEDDED = "sqlite+fakeredis"
SQLITE_REDIS = "sqlite+redis"
POSTGRES_REDIS = "postgres+redis"
SEED = 20251130
# More workers count as growth only past this ratio: two runs of the same code on this shared
# machine differ by 5-15% (4 vs 2 PostgreSQL workers measured 1.02, 1.02 and 0.86 one evening).
GROWTH = 1.05


class Results:
    """Measurements, floors and skipped scenarios, with the ratios the table reports."""

    def __init__(self) -> None:
        self.runs: list[Measurement] = []
        self.floors: dict[str, Measurement] = {}
        self.skipped: list[str] = []
        self.failed: list[str] = []

    def floor_for(self, store_label: str) -> Measurement | None:
        return self.floors.get("postgres" if store_label.startswith("postgres") else "sqlite")

    def naive_for(self, run: Measurement) -> Measurement | None:
        """The naive run on the same store with the same workers, else with one worker."""
        naive = {(m.store, m.workers): m for m in self.runs if m.path == "naive"}
        return naive.get((run.store, run.workers)) or naive.get((run.store, "1")) \
            or naive.get((run.store, "in-process"))

    def ratios(self, run: Measurement) -> dict[str, float | None]:
        floor, naive = self.floor_for(run.store), self.naive_for(run)
        return {
            "ratio_to_floor": run.per_second / floor.per_second if floor else None,
            "ratio_to_naive": run.per_second / naive.per_second
            if naive and run.path == "batched" else None,
        }

    def table(self) -> str:
        rows = []
        for run in [*self.runs, *self.floors.values()]:
            ratios = self.ratios(run) if run.path != "floor" else {}
            rows.append([run.path, run.store, run.workers, f"{run.commands:,}",
                         f"{run.seconds:.2f}", f"{run.per_second:,.0f}",
                         _ratio(ratios.get("ratio_to_floor")), _ratio(ratios.get("ratio_to_naive")),
                         "-" if run.cores_busy is None else f"{run.cores_busy:.2f}",
                         "-" if run.lock_held is None else f"{run.lock_held:.2f}"])
        return format_table(["path", "store", "workers", "commands", "seconds", "decisions/s",
                             "x floor", "x naive", "cores busy", "lock held"], rows)

    def goals(self) -> list[tuple[str, bool | None]]:
        """The issue's bar and the later goals, each met, missed, or None when not measured."""
        batched = [m for m in self.runs if m.path == "batched"]
        naive_ratios = [r for m in batched if (r := self.ratios(m)["ratio_to_naive"])]
        sqlite_floor = [r for m in batched if m.store != POSTGRES_REDIS
                        and (r := self.ratios(m)["ratio_to_floor"]) is not None]
        postgres = [m.per_second for m in sorted(
            (m for m in batched if m.store == POSTGRES_REDIS), key=lambda m: int(m.workers))]
        return [
            ("batched >= 10x naive on every store", min(naive_ratios) >= 10 if naive_ratios else None),
            ("batched >= 50x naive on every store", min(naive_ratios) >= 50 if naive_ratios else None),
            ("batched >= 0.25 of the SQLite floor (best run)",
             max(sqlite_floor) >= 0.25 if sqlite_floor else None),
            (f"PostgreSQL throughput grows with worker processes (each step >= {GROWTH}x)",
             all(b >= GROWTH * a for a, b in zip(postgres, postgres[1:], strict=False))
             if len(postgres) > 1 else None),
        ]

    def figures(self) -> list[Figure]:
        """Each batched run beside its floor and its naive run; PostgreSQL runs beside each other."""
        figures = []
        for run in (m for m in self.runs if m.path == "batched"):
            workers = "in-process worker" if run.workers == "in-process" else \
                f"{run.workers} worker(s)"
            label = f"decisions/s, {run.store}, {workers}"
            floor, naive = self.floor_for(run.store), self.naive_for(run)
            on_sqlite = run.store != POSTGRES_REDIS
            if floor is not None:
                ratio = run.per_second / floor.per_second
                figures.append(Figure(f"{label}, vs storage floor", run.per_second,
                                      floor.per_second, "decisions/s",
                                      f"bulk insert of the same rows ({floor.store})",
                                      ">= 0.25" if on_sqlite else "",
                                      ratio >= 0.25 if on_sqlite else None))
            if naive is not None:
                figures.append(Figure(f"{label}, vs naive", run.per_second, naive.per_second,
                                      "decisions/s", "one RQ job per command", ">= 50",
                                      run.per_second / naive.per_second >= 50))
        postgres = sorted((m for m in self.runs if m.path == "batched" and m.store == POSTGRES_REDIS),
                          key=lambda m: int(m.workers))
        for fewer, more in zip(postgres, postgres[1:], strict=False):
            figures.append(Figure(f"decisions/s, postgres+redis, {more.workers} vs {fewer.workers} "
                                  "workers", more.per_second, fewer.per_second, "decisions/s",
                                  f"{fewer.workers} worker(s), same run", f">= {GROWTH}",
                                  more.per_second >= GROWTH * fewer.per_second))
        return figures

    def as_json(self, commands: int, naive_commands: int, batch_size: int) -> dict[str, Any]:
        return {
            "benchmark": "decisions", "seed": SEED, "commands": commands,
            "naive_commands": naive_commands, "batch_size": batch_size,
            "runs": [m.as_json(**{name: None if r is None else round(r, 3)
                                  for name, r in self.ratios(m).items()}) for m in self.runs],
            "floors": [m.as_json() for m in self.floors.values()],
            "skipped": self.skipped, "failed": self.failed,
            "goals": [{"goal": goal, "met": met} for goal, met in self.goals()],
            "figures": [figure.as_json() for figure in self.figures()],
        }


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"
