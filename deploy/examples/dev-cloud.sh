# Sourced by the scripts here that watch a running `gangway dev up`: with
# STATE set to its state dir, reads its env file (REGIONS: the regions'
# names) and defines
#   psql_of REGION SQL   a query on the region's database as its superuser
#   metrics_of REGION    the region's Prometheus metrics, as text
#   bench_global PORT    starts a global replica on 127.0.0.1:PORT with dev
#                        up's flags but no practical rate limit (metrics on
#                        PORT + 10), straight to the regions; sets BENCH_PID
# shellcheck shell=bash disable=SC1091
source "$STATE/env"
IFS=, read -r -a REGIONS <<<"$GANGWAY_REGIONS"

psql_of() { # region, sql
    local pw port
    pw=$(cat "$STATE/regions/$1/pg/gangway-superuser.password" 2>/dev/null ||
        cat "$(dirname "$(readlink -f "$STATE/regions/$1/pg")")/pg/gangway-superuser.password")
    port=$(python3 -c "import json,sys; print(json.load(open('$STATE/dev.json'))['regions']['$1']['postgres'])")
    PGPASSWORD=$pw psql -qAtX -h 127.0.0.1 -p "$port" -U postgres -d gangway -F ' ' -c "$2"
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
