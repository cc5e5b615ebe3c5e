"""Python's limits on its default async Redis storage (coredis), as its docs
show it, on the load bench's inputs: a limit of a billion per second (never
refused) over 1,000 keys, CONCURRENCY asyncio tasks for DURATION_MS. Prints
one JSON line per strategy as `cargo bench --bench load` does.

    python limits_bench.py PORT CONCURRENCY DURATION_MS [ALGORITHM ...]

ALGORITHM: fixed_window (FixedWindowRateLimiter), sliding_log
(MovingWindowRateLimiter: one entry per call, as our sliding log),
sliding_window (SlidingWindowCounterRateLimiter: two weighted counters, as
ours). Default: all three.
"""

import asyncio
import json
import sys
import time

import coredis
from limits import RateLimitItemPerSecond
from limits.aio import strategies
from limits.storage import storage_from_string

KEYS = 1000
STRATEGIES = {
    "fixed_window": strategies.FixedWindowRateLimiter,
    "sliding_log": strategies.MovingWindowRateLimiter,
    "sliding_window": strategies.SlidingWindowCounterRateLimiter,
}
# The commands a check sends itself, per strategy: with coredis the fixed
# window is INCRBY, then EXPIRE at a window's first call (two commands, not
# one atomic script); the others are one script each (EVALSHA, or EVAL when
# the server does not have it yet), whose own commands are in its time.
SENT = {
    "fixed_window": {"incrby", "expire"},
    "sliding_log": {"evalsha", "eval"},
    "sliding_window": {"evalsha", "eval"},
}


async def usec_total(admin, sent):
    stats = await admin.info("commandstats")
    total = 0.0
    for name, fields in stats.items():
        if name.removeprefix("cmdstat_") in sent:
            total += float(fields["usec"])
    return total


async def run(port, concurrency, duration_ms, algorithm):
    storage = storage_from_string(f"async+redis://127.0.0.1:{port}")
    limiter = STRATEGIES[algorithm](storage)
    item = RateLimitItemPerSecond(1_000_000_000)
    admin = coredis.Redis(host="127.0.0.1", port=port, decode_responses=True)
    await admin.flushall()
    # The scripts loaded and the keys made before the timing.
    for i in range(KEYS):
        await limiter.hit(item, "limiter:load", str(i))
    await admin.config_resetstat()

    latencies = []
    deadline = time.perf_counter() + duration_ms / 1000

    async def task(t):
        n = 0
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            allowed = await limiter.hit(item, "limiter:load", str((t * 7919 + n) % KEYS))
            if not allowed:
                raise RuntimeError("the bench rule never refuses")
            latencies.append(int((time.perf_counter() - started) * 1e6))
            n += 1

    start = time.perf_counter()
    await asyncio.gather(*(task(t) for t in range(concurrency)))
    elapsed = time.perf_counter() - start
    usec = await usec_total(admin, SENT[algorithm])
    latencies.sort()
    ops = len(latencies)

    def at(p):
        return latencies[round((ops - 1) * p)] if ops else 0

    print(
        json.dumps(
            {
                "backend": "limits",
                "algorithm": algorithm,
                "concurrency": concurrency,
                "ops": ops,
                "ops_per_sec": round(ops / elapsed),
                "p50_us": at(0.5),
                "p99_us": at(0.99),
                "redis_usec_per_call": round(usec / ops, 2) if ops else 0,
            },
            separators=(",", ":"),
        ),
        flush=True,
    )


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    port, concurrency, duration_ms = (int(a) for a in sys.argv[1:4])
    algorithms = sys.argv[4:] or list(STRATEGIES)
    for algorithm in algorithms:
        if algorithm not in STRATEGIES:
            sys.exit(f"unknown algorithm {algorithm!r}: one of {', '.join(STRATEGIES)}")
        asyncio.run(run(port, concurrency, duration_ms, algorithm))


if __name__ == "__main__":
    main()
