"""How late a hold of the link emulator returns: `time.sleep` to a deadline against
`trainer.link.hold_until` (a sleep, then HOLD_POLL seconds polling the clock), one process.

    python -m benchmarks.link_hold

Per form: the median, 90th percentile and maximum lateness, in µs, over 200 holds of 17 ms
(about T(S, N) of the cnn1d's fused boundary on `wan` at world 2). A rough guide on a shared
machine; `autok bench --only i` measures the emulator in place (collective held / T).
"""

from __future__ import annotations

import statistics
import time

from trainer.link import hold_until


def _late(hold, n: int = 200, seconds: float = 0.017) -> list[float]:
    out = []
    for _ in range(n):
        deadline = time.perf_counter() + seconds
        hold(deadline)
        out.append(time.perf_counter() - deadline)
    return sorted(out)


def _sleep(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


def main() -> None:
    for name, hold in (("time.sleep", _sleep), ("hold_until", hold_until)):
        late = _late(hold)
        print(
            f"{name:12s} late by: median {statistics.median(late) * 1e6:7.1f} µs, "
            f"p90 {late[int(0.9 * len(late))] * 1e6:7.1f} µs, max {late[-1] * 1e6:7.1f} µs"
        )


if __name__ == "__main__":
    main()
