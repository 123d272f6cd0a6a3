#!/usr/bin/env bash
# A burst of mixed jobs through the global tier of a running `gangway dev up`
# (simulated executor), watched until every job has finished (issue 19;
# docs/benchmarks-history.md "A 10,000-GPU region under a burst").
#
#   gangway dev up --state-dir /tmp/gw-burst --fleet deploy/fleets/h100-10k.toml \
#       --executor sim --time-factor 0.01 &
#   deploy/examples/burst-bench.sh /tmp/gw-burst 3000 [max-minutes]
#
# Every 10 s it prints, per region: nodes not healthy, GPUs allocated of the
# schedulable ones, jobs queued / starting / running / finished (a job
# handed to a peer counts as finished where it left), whether the
# region is fenced, its agents' sync latency and its scheduling passes'
# durations (p50/p99 of the region's `gangway_sync_seconds` and
# `gangway_schedule_pass_seconds` since the last line, as bucket bounds),
# from the first submission on (the queue grows while they are sent).
# At the end: time to place every job, the worst of each figure, the health
# tick and scheduling pass durations, and each database's CPU seconds.
set -euo pipefail
STATE=${1:?state dir of a running gangway dev up}
JOBS=${2:-3000}
MAX_MIN=${3:-30}
GANGWAY=${GANGWAY:-target/release/gangway}
# The jobs' estimated run times (seconds, drawn evenly). The simulated
# executor runs a job for its estimate × dev up's --time-factor; the
# scheduler plans with the estimates as given, so with --time-factor 1 and
# DURATIONS=6-72 it plans on the clock the jobs really run by.
DURATIONS=${DURATIONS:-600-7200}
# shellcheck source=deploy/examples/dev-cloud.sh
source "$(dirname "$0")/dev-cloud.sh"

# Quantile q of a Prometheus histogram's bucket counts (cumulative, "le"
# order) between two scrapes: the smallest bucket bound holding q of them.
quantile() { # name, q, before-file, after-file[, label filter such as kind="changed"]
    python3 - "$@" <<'EOF'
import re, sys
name, q, a, b = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
want = sys.argv[5] if len(sys.argv) > 5 else ""
def read(path):
    out = {}
    for line in open(path):
        m = re.match(rf'{name}_bucket\{{.*le="([^"]+)".*\}} (\S+)', line)
        if m and want in line:
            le = float('inf') if m[1] == '+Inf' else float(m[1])
            out[le] = out.get(le, 0) + float(m[2])
    return out
x, y = read(a), read(b)
d = sorted((le, y[le] - x.get(le, 0)) for le in y)
if not d or d[-1][1] <= 0:
    print("-"); sys.exit()
total = d[-1][1]
for le, c in d:
    if c >= q * total:
        print("inf" if le == float('inf') else f"{le:g}s"); break
EOF
}
seconds_by() { # name, label, before-file, after-file: the histogram's summed seconds and count per label value
    python3 - "$@" <<'EOF'
import re, sys
name, label, a, b = sys.argv[1:5]
def read(path):
    out = {}
    for line in open(path):
        m = re.match(rf'{name}_(sum|count)\{{.*{label}="([^"]+)".*\}} (\S+)', line)
        if m:
            s, c = out.get(m[2], (0.0, 0.0))
            out[m[2]] = (s + float(m[3]), c) if m[1] == "sum" else (s, c + float(m[3]))
    return out
x, y = read(a), read(b)
rows = sorted(((k, v[0] - x.get(k, (0, 0))[0], v[1] - x.get(k, (0, 0))[1]) for k, v in y.items()),
              key=lambda r: -r[1])
print(", ".join(f"{k} {s:.1f} s / {c:.0f}" for k, s, c in rows if c > 0) or "-")
EOF
}
db_cpu() { # region: CPU seconds of its PostgreSQL processes (live ones)
    local dir pid total=0
    dir=$(readlink -f "$STATE/regions/$1/pg")
    pid=$(head -1 "$dir/postmaster.pid")
    for p in $pid $(pgrep -P "$pid"); do
        [ -r "/proc/$p/stat" ] || continue
        total=$((total + $(awk '{print $14 + $15 + $16 + $17}' "/proc/$p/stat")))
    done
    echo "scale=1; $total / $(getconf CLK_TCK)" | bc
}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for r in "${REGIONS[@]}"; do
    metrics_of "$r" >"$TMP/$r.start"
    cp "$TMP/$r.start" "$TMP/$r.prev"
    echo "$(db_cpu "$r")" >"$TMP/$r.cpu0"
done

echo "submitting $JOBS mixed jobs (1-2048 GPUs, $DURATIONS s estimated) through the global tier"
START=$(date +%s)
# Submitted in the background: the lines below sample the regions while
# the queue grows, too.
"$GANGWAY" loadgen --state-dir "$STATE" --url "${GANGWAY_URL:-$(echo "$GANGWAY_GLOBAL_REPLICAS" | cut -d, -f1)}" \
    --requests "$JOBS" --concurrency 16 --mix-max-gpus 2048 --mix-duration-s "$DURATIONS" \
    --tenants GANGWAY_TOKEN,GANGWAY_TOKEN_GLOBEX --timeout-s 60 --retry-after 20 \
    >"$TMP/loadgen.out" 2>"$TMP/loadgen.err" &
LOADGEN=$!
trap 'kill "$LOADGEN" 2>/dev/null; rm -rf "$TMP"' EXIT
SUBMITTED=""

placed_at=""
worst_unhealthy=0
fenced_seen=0
min_alloc_waiting=100
min_alloc_fits=100
min_fleet_waiting=100
printf '%6s  %-10s %9s %14s %7s %8s %7s %9s %6s %14s %14s\n' t region unhealthy "allocated" queued starting running finished fenced "sync p50/p99" "pass p50/p99"
while :; do
    now=$(date +%s)
    t=$((now - START))
    left=0
    queued_total=0
    fleet_alloc=0 fleet_sched=0 fleet_waiting=0
    for r in "${REGIONS[@]}"; do
        read -r unhealthy <<<"$(psql_of "$r" "SELECT count(*) FROM nodes WHERE observed <> 'healthy'")"
        read -r alloc sched <<<"$(psql_of "$r" "SELECT (SELECT count(*) FROM allocations WHERE released_at IS NULL),
            (SELECT count(*) FROM gpus g JOIN nodes n USING (node_id) WHERE NOT n.spare)")"
        read -r q s run fin <<<"$(psql_of "$r" "SELECT count(*) FILTER (WHERE state = 'queued'),
            count(*) FILTER (WHERE state IN ('starting', 'preempting')), count(*) FILTER (WHERE state = 'running'),
            count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'cancelled')) FROM jobs WHERE name = 'loadgen'")"
        # Work that waits: jobs queued for longer than a few passes (not
        # the ones that just arrived), and the sizes of the largest.
        read -r qold qsizes <<<"$(psql_of "$r" "SELECT count(*), coalesce(string_agg(gpus::text, ',' ORDER BY gpus DESC), '-')
            FROM jobs WHERE name = 'loadgen' AND state = 'queued' AND created_at < now() - interval '10 s'")"
        metrics_of "$r" >"$TMP/$r.now"
        fenced=$(grep -E '^gangway_region_fenced ' "$TMP/$r.now" | awk '{print $2}' || true)
        p50=$(quantile gangway_sync_seconds 0.5 "$TMP/$r.prev" "$TMP/$r.now")
        p99=$(quantile gangway_sync_seconds 0.99 "$TMP/$r.prev" "$TMP/$r.now")
        pp50=$(quantile gangway_schedule_pass_seconds 0.5 "$TMP/$r.prev" "$TMP/$r.now")
        pp99=$(quantile gangway_schedule_pass_seconds 0.99 "$TMP/$r.prev" "$TMP/$r.now")
        mv "$TMP/$r.now" "$TMP/$r.prev"
        pct=$(echo "scale=1; 100 * $alloc / $sched" | bc)
        printf '%5ss  %-10s %9s %6s/%-7s %7s %8s %7s %9s %6s %7s/%-6s %7s/%-6s\n' "$t" "$r" "$unhealthy" "$alloc" "$sched" "$q" "$s" "$run" "$fin" "${fenced:-?}" "$p50" "$p99" "$pp50" "$pp99"
        unhealthy=${unhealthy:-0} q=${q:-0} s=${s:-0} run=${run:-0}
        [ "$unhealthy" -gt "$worst_unhealthy" ] && worst_unhealthy=$unhealthy
        [ "${fenced:-0}" = "1" ] && fenced_seen=1
        if [ "${qold:-0}" -gt 0 ]; then
            p=${pct%.*}
            [ "$p" -lt "$min_alloc_waiting" ] && [ "$t" -gt 60 ] && min_alloc_waiting=$p
            if [ "$p" -lt 95 ]; then
                # Whole nodes free: what a gang of 8-GPU workers needs.
                whole=$(psql_of "$r" "SELECT count(*) FROM nodes n WHERE NOT n.spare
                    AND NOT EXISTS (SELECT 1 FROM allocations a
                                    WHERE a.node_id = n.node_id AND a.released_at IS NULL)")
                echo "        $r: ${qold} job(s) waiting over 10 s at ${pct} % allocated (${whole} whole nodes free), GPUs asked: ${qsizes:0:60}"
            fi
            # Of those, one no larger than the GPUs free now (by count:
            # a gang of whole nodes may still not fit free GPUs spread
            # over partly used nodes).
            smallest=${qsizes##*,}
            if [ "$smallest" != "-" ] && [ "$smallest" -le $((sched - alloc)) ]; then
                [ "$p" -lt "$min_alloc_fits" ] && [ "$t" -gt 60 ] && min_alloc_fits=$p
            fi
        fi
        fleet_alloc=$((fleet_alloc + alloc)) fleet_sched=$((fleet_sched + sched))
        fleet_waiting=$((fleet_waiting + ${qold:-0}))
        left=$((left + q + s + run))
        queued_total=$((queued_total + q))
    done
    if [ "$fleet_waiting" -gt 0 ] && [ "$t" -gt 60 ]; then
        fp=$((100 * fleet_alloc / fleet_sched))
        [ "$fp" -lt "$min_fleet_waiting" ] && min_fleet_waiting=$fp
    fi
    if [ -z "$SUBMITTED" ] && ! kill -0 "$LOADGEN" 2>/dev/null; then
        SUBMITTED=$now
        tail -25 "$TMP/loadgen.out"
        echo "submitted in $((SUBMITTED - START)) s"
    fi
    if [ -z "$placed_at" ] && [ -n "$SUBMITTED" ] && [ "$queued_total" -eq 0 ]; then
        placed_at=$t
    fi
    [ "$left" -eq 0 ] && [ -n "$SUBMITTED" ] && break
    [ "$t" -gt $((MAX_MIN * 60)) ] && { echo "gave up after $MAX_MIN minutes with $left jobs unfinished"; break; }
    sleep 10
done
END=$(date +%s)
echo
echo "all placed after: ${placed_at:-never} s; all finished after: $((END - START)) s"
echo "most nodes not healthy at once (one region): $worst_unhealthy; a region fenced: $([ $fenced_seen = 1 ] && echo yes || echo no)"
echo "lowest allocation while jobs waited over 10 s (after the first minute): ${min_alloc_waiting} %"
echo "lowest allocation while a job no larger than the free GPUs waited over 10 s: ${min_alloc_fits} %"
echo "lowest allocation of the whole fleet while jobs waited over 10 s anywhere: ${min_fleet_waiting} %"
for r in "${REGIONS[@]}"; do
    metrics_of "$r" >"$TMP/$r.end"
    echo "$r: sync p50 $(quantile gangway_sync_seconds 0.5 "$TMP/$r.start" "$TMP/$r.end")" \
        "p99 $(quantile gangway_sync_seconds 0.99 "$TMP/$r.start" "$TMP/$r.end");" \
        "health tick p50 $(quantile gangway_health_tick_seconds 0.5 "$TMP/$r.start" "$TMP/$r.end")" \
        "p99 $(quantile gangway_health_tick_seconds 0.99 "$TMP/$r.start" "$TMP/$r.end");" \
        "pass p50 $(quantile gangway_schedule_pass_seconds 0.5 "$TMP/$r.start" "$TMP/$r.end")" \
        "p99 $(quantile gangway_schedule_pass_seconds 0.99 "$TMP/$r.start" "$TMP/$r.end");" \
        "shed $(grep -E '^gangway_requests_shed_total' "$TMP/$r.end" | awk '{s+=$2} END {print s+0}');" \
        "database CPU $(echo "$(db_cpu "$r") - $(cat "$TMP/$r.cpu0")" | bc) s;" \
        "jobs handed to a peer to balance: $(psql_of "$r" "SELECT count(*) FROM handovers
            WHERE way = 'out' AND cause = 'balancing' AND at > to_timestamp($START)")"
    for kind in quiet changed failed; do
        echo "    sync ($kind): p50 $(quantile gangway_sync_seconds 0.5 "$TMP/$r.start" "$TMP/$r.end" "kind=\"$kind\"")" \
            "p99 $(quantile gangway_sync_seconds 0.99 "$TMP/$r.start" "$TMP/$r.end" "kind=\"$kind\"")"
    done
    echo "    waiting for a database connection, p99: main $(quantile gangway_db_pool_wait_seconds 0.99 "$TMP/$r.start" "$TMP/$r.end" 'pool="main"')," \
        "syncs $(quantile gangway_db_pool_wait_seconds 0.99 "$TMP/$r.start" "$TMP/$r.end" 'pool="syncs"')," \
        "leases $(quantile gangway_db_pool_wait_seconds 0.99 "$TMP/$r.start" "$TMP/$r.end" 'pool="leases"')"
    echo "    scheduling passes by phase (seconds summed / passes): $(seconds_by gangway_schedule_phase_seconds phase "$TMP/$r.start" "$TMP/$r.end")"
    echo "    snapshot reads (seconds summed / reads): $(seconds_by gangway_snapshot_read_seconds read "$TMP/$r.start" "$TMP/$r.end")"
done
echo
"$(dirname "$0")/alloc-while-waiting.sh" "$STATE" "$START"
