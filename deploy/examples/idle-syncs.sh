#!/usr/bin/env bash
# What a running `gangway dev up` costs while nothing happens: each region's
# agent syncs over SECS seconds (count, mean, and p50/p99 as bucket bounds
# of `gangway_sync_seconds`) and the CPU seconds of the regions, the agents,
# the global tier and PostgreSQL over the same time (issue 19;
# docs/benchmarks-history.md "One agent per leaf").
#
#   deploy/examples/idle-syncs.sh /tmp/gw-burst 60
set -uo pipefail
STATE=$1; SECS=${2:-60}
# shellcheck source=deploy/examples/dev-cloud.sh
source "$(dirname "$0")/dev-cloud.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cpu() { # pattern -> total cpu ticks
  local t=0
  for p in $(pgrep -f "$1"); do [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
pgcpu() { local t=0; for p in $( (pgrep -x postgres; pgrep -f "^postgres") | sort -u); do [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
snap() { echo "$(cpu ' region --name') $(cpu ' agent ') $(cpu ' global ') $(pgcpu)"; }
for r in "${REGIONS[@]}"; do metrics_of $r > "$TMP/$r.a"; done
read -r a1 a2 a3 a4 <<<"$(snap)"
sleep "$SECS"
read -r b1 b2 b3 b4 <<<"$(snap)"
for r in "${REGIONS[@]}"; do metrics_of $r > "$TMP/$r.b"; done
hz=$(getconf CLK_TCK)
echo "cpu seconds over $SECS s: regions $(( (b1-a1)/hz )) agents $(( (b2-a2)/hz )) global $(( (b3-a3)/hz )) postgres $(( (b4-a4)/hz ))"
python3 - "$TMP" "${REGIONS[@]}" <<'PY'
import re,sys
for r in sys.argv[2:]:
    def read(p):
        out={}; s=c=0
        for l in open(p):
            m=re.match(r'gangway_sync_seconds_bucket\{.*le="([^"]+)".*\} (\S+)',l)
            if m: le=float('inf') if m[1]=='+Inf' else float(m[1]); out[le]=out.get(le,0)+float(m[2])
            m=re.match(r'gangway_sync_seconds_sum(?:\{.*\})? (\S+)',l)
            if m: s+=float(m[1])
            m=re.match(r'gangway_sync_seconds_count(?:\{.*\})? (\S+)',l)
            if m: c+=float(m[1])
        return out,s,c
    (x,sa,ca),(y,sb,cb)=read(f'{sys.argv[1]}/{r}.a'),read(f'{sys.argv[1]}/{r}.b')
    d=sorted((le,y[le]-x.get(le,0)) for le in y)
    n=cb-ca
    def q(f):
        for le,c in d:
            if c>=f*d[-1][1]: return le
    print(f"{r}: syncs {n:.0f}, mean {((sb-sa)/n*1000) if n else 0:.1f} ms, p50<={q(.5)} p99<={q(.99)}")
PY
