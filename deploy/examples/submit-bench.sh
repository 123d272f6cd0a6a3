#!/usr/bin/env bash
# Submissions through global → region → PostgreSQL on a running
# `gangway dev up` (issue 23; docs/benchmarks.md "Global tier"): a benchmark
# global replica without dev up's rate limit, scheduling held off in every
# region, `gangway loadgen` for RUNS runs, and for each run the CPU each
# component spent per submission and, summed over the regions' databases,
# where PostgreSQL's time went (pg_stat_statements, statements inside
# functions and triggers included).
#
#   gangway dev up --state-dir /tmp/gw-bench --executor sim --time-factor 0.001 \
#       --pg-setting shared_preload_libraries=pg_stat_statements \
#       --pg-setting pg_stat_statements.track=all --pg-setting track_functions=pl &
#   deploy/examples/submit-bench.sh /tmp/gw-bench [runs] [seconds] [in-flight]
#
# WHOLE=1 leaves scheduling on (the "whole cloud" figure). TOP=N statements
# are listed (default 12). The held leader locks and the benchmark replica
# are let go when the script ends.
set -euo pipefail
STATE=${1:?state dir of a running gangway dev up}
RUNS=${2:-3}
SECONDS_PER_RUN=${3:-20}
IN_FLIGHT=${4:-32}
TOP=${TOP:-12}
GANGWAY=${GANGWAY:-target/release/gangway}
BENCH_PORT=${BENCH_PORT:-18443}
# shellcheck source=deploy/examples/dev-cloud.sh
source "$(dirname "$0")/dev-cloud.sh"

# Where the databases' time goes is shown when dev up loaded
# pg_stat_statements (it costs a little CPU itself: leave it out for the
# headline figures).
STATS=
for r in "${REGIONS[@]}"; do
    if psql_of "$r" "SHOW shared_preload_libraries" | grep -q pg_stat_statements; then
        psql_of "$r" "SET client_min_messages = warning;
                      CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
        STATS=1
    fi
done

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -n "${WHOLE:-}" ] || release_scheduling
}
trap cleanup EXIT

# The benchmark's global replica: dev up's flags, straight to the regions,
# no practical rate limit.
bench_global "$BENCH_PORT"
GLOBAL=$BENCH_PID
pids+=("$GLOBAL")

if [ -z "${WHOLE:-}" ]; then
    hold_scheduling
fi

devup_pid() { pgrep -f " dev up --state-dir $STATE" | head -1; }
scrape() { # the benchmark replica's and every region's metrics, as text
    curl -s "http://127.0.0.1:$((BENCH_PORT + 10))/metrics"
    local r
    for r in "${REGIONS[@]}"; do metrics_of "$r"; done
}
snapshot() { echo "$(ticks "$GLOBAL") $(ticks $(region_pids)) $(ticks $(pg_pids)) $(ticks "$(devup_pid)")"; }

for run in $(seq 1 "$RUNS"); do
    for r in "${REGIONS[@]}"; do
        clear_queue "$r"
        [ -z "$STATS" ] || psql_of "$r" "SELECT pg_stat_statements_reset()" >/dev/null
    done
    scrape >"$STATE/bench-metrics.before"
    before=$(snapshot)
    out=$($GANGWAY loadgen --state-dir "$STATE" --url "https://127.0.0.1:$BENCH_PORT" \
        --duration-s "$SECONDS_PER_RUN" --concurrency "$IN_FLIGHT" --json 2>/dev/null) || true # errors: in the JSON
    after=$(snapshot)
    scrape >"$STATE/bench-metrics.after"
    python3 - "$before" "$after" "$HZ" "$out" "$run" <<'EOF'
import json, sys
b, a, hz, out, run = sys.argv[1].split(), sys.argv[2].split(), int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
n = out["requests"]
cpu = [(int(y) - int(x)) / hz * 1000 / max(n, 1) for x, y in zip(b, a)]
lat = out["latency_ok"] or {}
print(f"run {run}: {out['throughput_per_s']:.0f} submissions/s, p50 {lat.get('p50_ms', 0):.1f} ms, "
      f"p99 {lat.get('p99_ms', 0):.1f} ms, errors {out['errors']}; CPU ms per submission: "
      f"global {cpu[0]:.2f} / regions {cpu[1]:.2f} / PostgreSQL {cpu[2]:.2f} / "
      f"dev up's links {cpu[3]:.2f} / loadgen {out['loadgen_cpu_s'] * 1000 / max(n, 1):.2f}")
EOF
    # The mean time of each phase of a create, global and regional.
    python3 - "$STATE/bench-metrics.before" "$STATE/bench-metrics.after" <<'EOF'
import re, sys
def read(path):
    out = {}
    for line in open(path):
        m = re.match(r'(gangway_(?:global_create_phase|submit_phase|intent_handover)_seconds|gangway_intent_batch_size)_(sum|count)(?:\{(?:phase|step)="([^"]+)"\})? (\S+)', line)
        if m:
            k = (m[1], m[3] or "")
            s, c = out.get(k, (0.0, 0.0))
            out[k] = (s + float(m[4]), c) if m[2] == "sum" else (s, c + float(m[4]))
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
parts = []
for k in sorted(b):
    s, c = b[k][0] - a.get(k, (0, 0))[0], b[k][1] - a.get(k, (0, 0))[1]
    if c > 0:
        name = k[0].replace("gangway_", "").replace("_phase_seconds", "").replace("_seconds", "")
        parts.append(f"{name} {s / c:.2f}" if "batch" in name else f"{name}/{k[1]} {s / c * 1000:.1f} ms")
print("  mean: " + ", ".join(parts))
EOF
    # Where the databases' time went this run, summed over the regions.
    [ -n "$STATS" ] || continue
    for r in "${REGIONS[@]}"; do
        psql_of "$r" "COPY (SELECT calls, total_exec_time, rows, wal_records, toplevel,
                             regexp_replace(left(query, 110), '\s+', ' ', 'g')
                      FROM pg_stat_statements WHERE calls > 0) TO STDOUT WITH CSV"
    done | python3 -c "
import csv, sys
agg = {}
for calls, ms, rows, wal, top, q in csv.reader(sys.stdin):
    k = (q, top)
    c = agg.setdefault(k, [0, 0.0, 0, 0])
    c[0] += int(calls); c[1] += float(ms); c[2] += int(rows); c[3] += int(wal)
total = sum(v[1] for (q, top), v in agg.items() if top == 't')
print(f'  PostgreSQL: {total / 1000:.2f} s executing top-level statements; the top $TOP by time:')
print('  ' + ' | '.join(['ms total', 'calls', 'ms/call', 'rows', 'WAL recs', 'level', 'statement']))
for (q, top), (calls, ms, rows, wal) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:$TOP]:
    lvl = 'top' if top == 't' else 'nested'
    print(f'  {ms:9.0f} | {calls:6d} | {ms / calls:7.3f} | {rows:6d} | {wal:7d} | {lvl:6s} | {q}')
"
    for r in "${REGIONS[@]}"; do
        psql_of "$r" "SELECT funcname, calls, round(total_time::numeric, 1) FROM pg_stat_user_functions
                      WHERE calls > 0 ORDER BY total_time DESC LIMIT 5"
    done | awk 'NF { t[$1] += $3; c[$1] += $2 } END { for (f in t) printf "  function %s: %d calls, %.0f ms\n", f, c[f], t[f] }'
done
