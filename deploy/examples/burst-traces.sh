#!/usr/bin/env bash
# The issue-19 burst as traces for `gangway sim` (docs/benchmarks-history.md,
# "Session 14"): one region's share of `burst-bench.sh`'s jobs — sizes
# from `gangway loadgen --mix-max-gpus 2048` (powers of two from 1 to
# 2,048 GPUs, weight 1/√g), estimates drawn evenly from MIN-MAX seconds,
# two tenants alternating, arrivals a Poisson stream at RATE a second —
# one CSV in the Philly format per seed, so a policy can be judged on
# many bursts instead of one live run:
#
#   deploy/examples/burst-traces.sh OUT_DIR [SEEDS=10] [JOBS=1000] [RATE=10] [MIN-MAX=6-72]
#   for s in OUT_DIR/burst-*.csv; do
#       gangway sim --trace "$s" --fleet deploy/fleets/h100-10k.toml
#   done
set -euo pipefail
OUT=${1:?output directory}
SEEDS=${2:-10}
JOBS=${3:-1000}
RATE=${4:-10}
RANGE=${5:-6-72}
mkdir -p "$OUT"
python3 - "$OUT" "$SEEDS" "$JOBS" "$RATE" "$RANGE" <<'PY'
import datetime, random, sys
out, seeds, jobs, rate, span = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
lo, hi = map(int, span.split("-"))
sizes = [2 ** k for k in range(12)]
weights = [1 / g ** 0.5 for g in sizes]
start = datetime.datetime(2026, 1, 1)
for seed in range(seeds):
    rnd = random.Random(seed)
    t = 0.0
    with open(f"{out}/burst-{seed}.csv", "w") as f:
        f.write("timestamp,duration,num_gpus,gpu_time,cluster\n")
        for i in range(jobs):
            t += rnd.expovariate(rate)
            g = rnd.choices(sizes, weights=weights)[0]
            d = rnd.randint(lo, hi)
            at = (start + datetime.timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S")
            f.write(f"{at},{d},{g},{d * g},{'acme' if i % 2 else 'globex'}\n")
PY
echo "$SEEDS traces of $JOBS jobs in $OUT"
