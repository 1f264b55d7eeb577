"""Do ServeGen's days repeat? Whether a daily seasonal forecast could help the planner on the
`servegen-day1` workload of bench/replay_quality.py.

ServeGen m-large's aggregate rate curve (data/traces/) has 14 days of 144 ten-minute windows.
For each pair of consecutive days it prints the correlation of their rate curves, then, for
day 2 (the replayed one, windows 144..287), the RMS error in log rate of three forecasts of its
shape: the day before (seasonal naive), the mean log curve of the other 13 days, and day 2's own
flat mean (which knows the day's level, and so favours it). The two daily forecasts are
compared after removing their means: only the shape over the day is tested, not the level.

    .venv/bin/python -m bench.servegen_days
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.sim.world.workload import read_rate_curve

ROOT = Path(__file__).resolve().parents[1]

SERVEGEN = ROOT / "data" / "traces" / "language_m-large_aggregate_rate.csv"
WINDOWS_PER_DAY = 144
REPLAYED_DAY = 1  # 0-based: windows 144..287


def rms(error: np.ndarray) -> float:
    return float(np.sqrt(np.mean(error**2)))


def main() -> None:
    rates = np.array([w.rate_rps for w in read_rate_curve(SERVEGEN)])
    days = len(rates) // WINDOWS_PER_DAY
    logs = np.log(rates[: days * WINDOWS_PER_DAY].reshape(days, WINDOWS_PER_DAY))
    print(f"{days} days of {WINDOWS_PER_DAY} windows\n")
    print("| days | correlation of the rate curves |")
    print("|---|---|")
    correlations = []
    for d in range(days - 1):
        c = float(np.corrcoef(np.exp(logs[d]), np.exp(logs[d + 1]))[0, 1])
        correlations.append(c)
        print(f"| {d + 1} and {d + 2} | {c:+.2f} |")
    low, high = min(correlations), max(correlations)
    print(f"\nmedian {np.median(correlations):+.2f}, range {low:+.2f} to {high:+.2f}\n")

    day = logs[REPLAYED_DAY]
    shape = day - day.mean()
    before = logs[REPLAYED_DAY - 1]
    others = np.delete(logs, REPLAYED_DAY, axis=0).mean(axis=0)
    print(f"RMS error in log rate over day {REPLAYED_DAY + 1}'s windows:\n")
    print("| forecast of the day's shape | RMS log error |")
    print("|---|---|")
    print(f"| the day before | {rms(shape - (before - before.mean())):.2f} |")
    print(f"| mean of the other {days - 1} days | {rms(shape - (others - others.mean())):.2f} |")
    print(f"| flat (no shape at all) | {rms(shape):.2f} |")


if __name__ == "__main__":
    main()
