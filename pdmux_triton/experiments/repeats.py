"""A point served several times (`--repeats`): one row of medians, and how far the repeats
spread. Near a strategy's cliff one run of a point cannot rank anything (its attainment can
move tens of points between two runs of the same requests), so a measured figure carries its
spread and the simulator's error is read against it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

MAX_REPEATS = 20  # times one point may be served


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def spread_pct(values: list[float]) -> float | None:
    """(highest - lowest) / |median| in percent; 0 for equal values, None where the median
    is 0 and the values differ (no scale to read the spread against)."""
    low, high, mid = min(values), max(values), statistics.median(values)
    if high == low:
        return 0.0
    return None if mid == 0 else (high - low) / abs(mid) * 100


def combined(rows: list[dict], summed: Iterable[str] = ()) -> dict:
    """One row for repeats of a point: each number the median of the repeats (those in
    `summed` added up: a count of what went wrong in any of them, or a table of such counts
    by name, `summed_tables`), anything else the first repeat's (a figure some repeat lacks,
    None, too); `repeats` how many there were and, for each number, every repeat's value
    (`repeat_values`) and their `spread_pct`."""
    if len(rows) == 1:
        return dict(rows[0])
    summed = set(summed)
    out, each, spread = dict(rows[0]), {}, {}
    for key in rows[0]:
        values = [r.get(key) for r in rows]
        if key in summed and all(isinstance(v, dict) for v in values):
            out[key] = summed_tables(values)
            continue
        if not all(_number(v) for v in values):
            continue
        if key in summed:
            out[key] = sum(values)
            continue
        out[key] = statistics.median(values)
        each[key] = values
        spread[key] = spread_pct(values)
    out.update(repeats=len(rows), repeat_values=each, spread_pct=spread)
    return out


def summed_tables(tables: list[dict[str, dict]]) -> dict[str, dict]:
    """Repeats' tables of counts by name ({name: {field: number}}) added up, field by field."""
    out: dict[str, dict] = {}
    for table in tables:
        for name, counts in table.items():
            entry = out.setdefault(name, dict.fromkeys(counts, 0))
            for field, value in counts.items():
                entry[field] = entry.get(field, 0) + value
    return out


def repeat(row: dict, i: int) -> dict:
    """The `i`-th repeat's own figures of a combined row (the row itself if it was served
    once)."""
    return {**row, **{k: v[i] for k, v in row.get("repeat_values", {}).items()}}
