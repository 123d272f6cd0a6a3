# Sourced by the scripts here that watch a running `gangway dev up`: with
# STATE set to its state dir, reads its env file (REGIONS: the regions'
# names) and defines
#   psql_of REGION SQL   a query on the region's database as its superuser
#   metrics_of REGION    the region's Prometheus metrics, as text
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
