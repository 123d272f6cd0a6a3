#!/usr/bin/env bash
# How long a job takes to start on an idle cloud: N jobs submitted one
# after another through the global tier (`gangway job submit`, 1 GPU each,
# running for a while so the fleet stays idle enough), then each job's
# timeline read back (`gangway job events --json`): queued → placed (the
# scheduling pass and its commit) and placed → started (the agent hearing
# of its assignment, launching the worker and reporting it running).
#
#   deploy/examples/start-latency.sh STATE_DIR [jobs]
#
# Needs a running `gangway dev up` (STATE_DIR its state dir) with room for
# the jobs; GANGWAY picks the binary (default target/release/gangway).
set -euo pipefail
STATE=${1:?state dir of a running gangway dev up}
N=${2:-30}
GANGWAY=$(readlink -f "${GANGWAY:-target/release/gangway}")
export GANGWAY_STATE_DIR=$STATE
ids=()
for _ in $(seq "$N"); do
    ids+=("$("$GANGWAY" job submit --json --gpus 1 --gpu-type h100 --estimated-duration-s 600 -- true |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')")
    sleep 0.3
done
sleep 3
for id in "${ids[@]}"; do
    "$GANGWAY" job events --json "$id"
    echo
done | python3 -c '
import json, sys
from datetime import datetime
dec = json.JSONDecoder(); s = sys.stdin.read(); i = 0; placed, started = [], []
while i < len(s):
    while i < len(s) and s[i].isspace(): i += 1
    if i >= len(s): break
    o, i = dec.raw_decode(s, i)
    at = {e["kind"]: datetime.fromisoformat(e["at"].replace("Z", "+00:00")) for e in o["events"]}
    if "placed" in at and "started" in at:
        placed.append((at["placed"] - at["queued"]).total_seconds() * 1000)
        started.append((at["started"] - at["placed"]).total_seconds() * 1000)
def q(v, p): v = sorted(v); return v[min(len(v) - 1, int(p * len(v)))]
for name, v in (("queued -> placed", placed), ("placed -> started", started)):
    print(f"{name:18} {len(v):3d} jobs: p50 {q(v, .5):7.0f} ms, p90 {q(v, .9):7.0f} ms, max {max(v):7.0f} ms")
'
