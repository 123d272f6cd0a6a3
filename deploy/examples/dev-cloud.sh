# Sourced by the scripts here that watch a running `gangway dev up`: with
# STATE set to its state dir, reads its env file (REGIONS: the regions'
# names) and defines
#   psql_of REGION SQL   a query on the region's database as its superuser
#                        (SQL empty: the statements are read from stdin)
#   metrics_of REGION    the region's Prometheus metrics, as text
#   bench_global PORT    starts a global replica on 127.0.0.1:PORT with dev
#                        up's flags but no practical rate limit (metrics on
#                        PORT + 10), straight to the regions; sets BENCH_PID
#   hold_scheduling      no region schedules until release_scheduling or
#                        the script ends (sets HELD_PIDS)
#   clear_queue REGION   deletes the region's queued jobs and vacuums
# shellcheck shell=bash disable=SC1091
source "$STATE/env"
IFS=, read -r -a REGIONS <<<"$GANGWAY_REGIONS"

psql_of() { # region, sql (empty: read from stdin)
    local pw port pid
    local sql=(-c "$2")
    [ -n "$2" ] || sql=()
    if [ -d "$STATE/regions/$1/patroni" ]; then
        # dev up --db ha: the region's own URL (its members, the primary
        # chosen by target_session_attrs), from its process.
        pid=$(pgrep -f " region --name $1 " | head -1)
        psql -qAtX -F ' ' "${sql[@]}" \
            "$(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^GANGWAY_DATABASE_URL=//p')"
        return
    fi
    pw=$(cat "$STATE/regions/$1/pg/gangway-superuser.password" 2>/dev/null ||
        cat "$(dirname "$(readlink -f "$STATE/regions/$1/pg")")/pg/gangway-superuser.password")
    port=$(python3 -c "import json,sys; print(json.load(open('$STATE/dev.json'))['regions']['$1']['postgres'])")
    PGPASSWORD=$pw psql -qAtX -h 127.0.0.1 -p "$port" -U postgres -d gangway -F ' ' "${sql[@]}"
}

metrics_of() { # region
    local var
    var=GANGWAY_REGION_$(echo "$1" | tr a-z- A-Z_)_METRICS_URL
    curl -s "${!var}"
}

bench_global() { # port
    ${GANGWAY:-target/release/gangway} global --listen "127.0.0.1:$1" \
        --tls-cert "$STATE/tls/server.pem" --tls-key "$STATE/tls/server-key.pem" \
        --tenant-key dev-tenant-1="$STATE/keys/tenant-signing.pub.pem" \
        --operator-key dev-operator-1="$STATE/keys/operator-signing.pub.pem" \
        --service-signing-key dev-service-1="$STATE/keys/service-signing.pem" \
        --region-ca "$STATE/tls/ca.pem" \
        --region us-east="$GANGWAY_REGION_US_EAST_URL" --region us-west="$GANGWAY_REGION_US_WEST_URL" \
        --region eu-central="$GANGWAY_REGION_EU_CENTRAL_URL" \
        --metrics-listen "127.0.0.1:$(($1 + 10))" \
        --rate-limit 100000 --rate-burst 100000 >"$STATE/logs/bench-global-$1.log" 2>&1 &
    BENCH_PID=$!
    for _ in $(seq 50); do
        curl -s --cacert "$STATE/tls/ca.pem" "https://127.0.0.1:$1/v1/regions" >/dev/null && return
        sleep 0.2
    done
}

# A psql session holds each region's leader lock (regional/src/leader.rs)
# and the leader's own connection is ended. The session queues for the
# lock first, so that it, not the leader's next try, gets it. It then idles
# outside any transaction: a session left in a statement (say pg_sleep)
# would hold every vacuum back, and each run would find the tables more
# bloated than the last.
HOLD_APP=gangway-bench-hold
hold_scheduling() {
    local lock=7449356649126781284 r var fifo fd
    HELD_PIDS=()
    HELD_FDS=()
    for r in "${REGIONS[@]}"; do
        # Its statements come from a pipe this shell holds open: when the
        # script ends, however it ends, psql reads EOF and lets go.
        fifo=$(mktemp -u)
        mkfifo "$fifo"
        PGAPPNAME=$HOLD_APP psql_of "$r" "" <"$fifo" >/dev/null 2>&1 &
        HELD_PIDS+=($!)
        exec {fd}>"$fifo"
        rm "$fifo"
        HELD_FDS+=("$fd")
        echo "SELECT pg_advisory_lock($lock);" >&"$fd"
        sleep 1
        psql_of "$r" "SELECT pg_terminate_backend(pid) FROM pg_locks
                      WHERE locktype = 'advisory' AND objid = ($lock::bigint & 4294967295)
                        AND granted" >/dev/null
    done
    sleep 3
    for r in "${REGIONS[@]}"; do
        var=GANGWAY_REGION_$(echo "$r" | tr a-z- A-Z_)_METRICS_URL
        if [ "$(curl -s "${!var}" | awk '/^gangway_scheduler_leader / {print $2}')" = 1 ]; then
            echo "$r still schedules: its leader lock was not taken" >&2
            exit 1
        fi
    done
}

release_scheduling() { # the held sessions ended; every region schedules again
    local fd
    for fd in "${HELD_FDS[@]}"; do exec {fd}>&-; done
    wait "${HELD_PIDS[@]}" 2>/dev/null || true
    HELD_PIDS=()
    HELD_FDS=()
}

# CPU accounting for the benchmarks: clock ticks (HZ a second) of user and
# system time.
HZ=$(getconf CLK_TCK)
postmaster() { # region: its PostgreSQL servers' postmasters (three with dev up --db ha)
    local f
    for f in "$(readlink -f "$STATE/regions/$1/pg")/postmaster.pid" "$STATE/regions/$1"/patroni/*/data/postmaster.pid; do
        [ -r "$f" ] && head -1 "$f"
    done
}
ticks() { # pid...: utime+stime (+ reaped children) of each, summed
    local t=0 p f
    for p in "$@"; do
        [ -r "/proc/$p/stat" ] || continue
        f=$(sed 's/^.*) //' "/proc/$p/stat")
        t=$((t + $(echo "$f" | awk '{print $12 + $13 + $14 + $15}')))
    done
    echo $t
}
busy_ticks() { # the whole machine's busy time (user, nice, system, irq, softirq)
    awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat
}
region_pids() { pgrep -f " region --name " | tr '\n' ' '; }
pg_pids() { local r m; for r in "${REGIONS[@]}"; do for m in $(postmaster "$r"); do echo -n "$m $(pgrep -P "$m" | tr '\n' ' ') "; done; done; }

clear_queue() { # region
    psql_of "$1" "CREATE TEMP TABLE q AS SELECT job_id FROM jobs WHERE state = 'queued'
                                         ORDER BY job_id FOR UPDATE;
                  DELETE FROM workers WHERE job_id IN (SELECT job_id FROM q);
                  DELETE FROM job_events WHERE job_id IN (SELECT job_id FROM q);
                  DELETE FROM gpu_holds WHERE job_id IN (SELECT job_id FROM q);
                  DELETE FROM checkpoints WHERE job_id IN (SELECT job_id FROM q);
                  DELETE FROM jobs WHERE job_id IN (SELECT job_id FROM q);
                  SELECT pg_stat_reset()" >/dev/null
    local t
    for t in jobs workers job_events replica_jobs idempotency_claims; do
        psql_of "$1" "VACUUM (ANALYZE) $t" >/dev/null
    done
}
