"""Threshold gates on derived figures, where equality passes (spec: "exceeds" is `>`, "below"
is `<`).

A figure a gate derives (a quality drop `baseline - candidate`, a throughput ratio) carries the
rounding of its arithmetic: 0.90 - 0.87 is 0.030000000000000027, so a drop equal to a 0.03
allowance compared with a bare `>` failed the gate. These compare to within a relative 1e-9
(and an absolute 1e-12 near zero), far below any measurement's precision and far above the
rounding of one subtraction or division.
"""

from __future__ import annotations

import math

REL_TOL = 1e-9
ABS_TOL = 1e-12


def exceeds(figure: float, limit: float) -> bool:
    """`figure > limit`, where a figure equal to the limit but for rounding passes."""
    return figure > limit and not math.isclose(figure, limit, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def below(figure: float, limit: float) -> bool:
    """`figure < limit`, where a figure equal to the limit but for rounding passes."""
    return figure < limit and not math.isclose(figure, limit, rel_tol=REL_TOL, abs_tol=ABS_TOL)
