// rate-limiter-flexible's RateLimiterRedis on ioredis, as its docs show it,
// on the load bench's inputs: a fixed window of a billion per second (never
// refuses) over 1,000 keys, `concurrency` callers at once for `duration_ms`.
// Prints one JSON line as `cargo bench --bench load` does.
//
//   node rate_limiter_flexible.js PORT CONCURRENCY DURATION_MS
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const KEYS = 1000;
const [port, concurrency, durationMs] = process.argv.slice(2).map(Number);
if (!port || !concurrency || !durationMs) {
  console.error('usage: node rate_limiter_flexible.js PORT CONCURRENCY DURATION_MS');
  process.exit(2);
}

// The commands a check sends itself: ioredis runs the limiter's script with
// EVALSHA (EVAL when the server does not have it yet).
const SENT = ['evalsha', 'eval'];

async function usecTotal(admin) {
  let usec = 0;
  for (const line of (await admin.info('commandstats')).split('\n')) {
    const m = /^cmdstat_([^:]+):.*usec=(\d+)/.exec(line);
    if (m && SENT.includes(m[1])) usec += Number(m[2]);
  }
  return usec;
}

async function main() {
  const client = new Redis({ host: '127.0.0.1', port, enableOfflineQueue: false });
  const admin = new Redis({ host: '127.0.0.1', port });
  await Promise.all([client, admin].map((c) => new Promise((ok) => c.once('ready', ok))));
  await admin.flushall();
  const limiter = new RateLimiterRedis({
    storeClient: client,
    points: 1e9,
    duration: 1,
    keyPrefix: 'limiter:load',
  });
  // The script loaded and the keys made before the timing.
  for (let i = 0; i < KEYS; i++) await limiter.consume(String(i));
  await admin.config('RESETSTAT');

  const deadline = process.hrtime.bigint() + BigInt(durationMs) * 1000000n;
  const latencies = [];
  const start = process.hrtime.bigint();
  await Promise.all(
    Array.from({ length: concurrency }, async (_, task) => {
      for (let n = 0; process.hrtime.bigint() < deadline; n++) {
        const started = process.hrtime.bigint();
        const res = await limiter.consume(String((task * 7919 + n) % KEYS));
        if (res.remainingPoints < 0) throw new Error('the bench rule never refuses');
        latencies.push(Number((process.hrtime.bigint() - started) / 1000n));
      }
    }),
  );
  const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  const usec = await usecTotal(admin);
  latencies.sort((a, b) => a - b);
  const at = (p) => latencies[Math.round((latencies.length - 1) * p)] || 0;
  const ops = latencies.length;
  console.log(
    JSON.stringify({
      backend: 'rate-limiter-flexible',
      algorithm: 'fixed_window',
      concurrency,
      ops,
      ops_per_sec: Math.round(ops / elapsed),
      p50_us: at(0.5),
      p99_us: at(0.99),
      redis_usec_per_call: Math.round((100 * usec) / ops) / 100,
    }),
  );
  client.disconnect();
  admin.disconnect();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
