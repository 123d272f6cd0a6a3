#!/usr/bin/env bash
# How fully a running `gangway dev up` kept its GPUs allocated while work
# waited, integrated over time from the databases' own records (issue 19;
# docs/benchmarks-history.md "A 10,000-GPU region under a burst"), not sampled:
#
#   deploy/examples/alloc-while-waiting.sh STATE SINCE_EPOCH_S [GRACE_S]
#
# A job "waits" from GRACE_S (default 10) seconds after it was created until
# its first GPU was allocated (a job placed within the grace never waits:
# it only arrived between two passes); only `loadgen` jobs count. In one
# region, a job that moved between regions (balancing) waits from GRACE_S
# after it arrived there until it was placed there or left; for the fleet,
# from GRACE_S after its creation until it was first placed anywhere. Between
# SINCE and now, per region and for the whole fleet, it prints the
# time-weighted allocation (GPUs allocated / schedulable GPUs) over the
# time some job waited, how much of that time was spent below 95 %, and
# the same while the job waiting was no larger than the GPUs free then (a
# job that could have fitted by count; a gang of whole nodes may still not
# fit GPUs spread over partly used nodes). Then where the idle GPU-seconds
# while work waited went, by the length of each GPU's idle gap between two
# allocations: gaps of a second or two are the live loop's turnaround (an
# exit reported, the next pass placing on the freed GPUs); long ones are
# GPUs kept free for a big gang, or left free as no waiting gang fits.
set -euo pipefail
STATE=${1:?state dir of a running gangway dev up}
SINCE=${2:?the run start, seconds since the epoch}
GRACE=${3:-10}
# shellcheck source=deploy/examples/dev-cloud.sh
source "$(dirname "$0")/dev-cloud.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

for r in "${REGIONS[@]}"; do
    psql_of "$r" "SELECT count(*) FROM gpus g JOIN nodes n USING (node_id) WHERE NOT n.spare" >"$TMP/$r.sched"
    psql_of "$r" "SELECT extract(epoch FROM allocated_at)::float8,
                         coalesce(extract(epoch FROM released_at)::float8, 'Infinity'), count(*)
                  FROM allocations
                  WHERE released_at IS NULL OR released_at > to_timestamp($SINCE)
                  GROUP BY 1, 2" >"$TMP/$r.allocs"
    psql_of "$r" "SELECT j.job_id, extract(epoch FROM j.created_at)::float8,
                         extract(epoch FROM coalesce((SELECT max(h.at) FROM handovers h
                                 WHERE h.job_id = j.job_id AND h.way = 'in'), j.created_at))::float8,
                         coalesce((SELECT extract(epoch FROM min(a.allocated_at))::float8
                                   FROM allocations a WHERE a.job_id = j.job_id), 'Infinity'),
                         coalesce((SELECT extract(epoch FROM max(h.at))::float8 FROM handovers h
                                   WHERE h.job_id = j.job_id AND h.way = 'out'), 'Infinity'),
                         j.gpus
                  FROM jobs j WHERE j.name = 'loadgen' AND j.created_at > to_timestamp($SINCE)" >"$TMP/$r.jobs"
    psql_of "$r" "SELECT a.node_id || ':' || a.gpu_index, extract(epoch FROM a.allocated_at)::float8,
                         coalesce(extract(epoch FROM a.released_at)::float8, 'Infinity')
                  FROM allocations a JOIN nodes n USING (node_id)
                  WHERE NOT n.spare AND (a.released_at IS NULL OR a.released_at > to_timestamp($SINCE))
                  ORDER BY 1, 2" >"$TMP/$r.gpus"
done

python3 - "$TMP" "$SINCE" "$GRACE" "$(date +%s)" "${REGIONS[@]}" <<'PY'
import sys
tmp, since, grace, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
regions = sys.argv[5:]

def load(r):
    sched = int(open(f"{tmp}/{r}.sched").read().split()[0])
    events = []  # (time, d_alloc, d_waiting, waiting_gpus or None)
    for line in open(f"{tmp}/{r}.allocs"):
        a, b, n = line.split()
        events.append((max(float(a), since), int(n), 0, 0))
        if b != "Infinity":
            events.append((float(b), -int(n), 0, 0))
    for line in open(f"{tmp}/{r}.jobs"):
        job, created, arrived, placed, left, g = line.split()
        start = float(arrived) + grace
        stop = min(end, float(placed), float(left))
        if stop > start:
            events.append((start, 0, 1, int(g)))
            events.append((stop, 0, -1, -int(g)))
        # For the fleet: created (anywhere), first placed (anywhere).
        first = fleet_jobs.setdefault(job, [float(created), float("inf"), int(g)])
        first[0] = min(first[0], float(created))
        first[1] = min(first[1], float(placed))
    return sched, sorted(events)

fleet_jobs = {}  # job id: [created, first placed anywhere, gpus]

GAP_CLASSES = [(1.0, "< 1 s"), (3.0, "1–3 s"), (10.0, "3–10 s"), (float("inf"), "≥ 10 s")]

def idle_gaps(r, series, sched):
    """GPU-seconds idle while work waited, by the length of the idle gap."""
    import bisect
    # The times some job waited, as sorted disjoint intervals.
    spans, waiting, t0 = [], 0, None
    for t, _, dw, _ in series:
        if not dw:
            continue
        t = min(max(t, since), end)
        if waiting == 0 and dw > 0:
            t0 = t
        waiting += dw
        if waiting == 0 and t0 is not None and t > t0:
            spans.append((t0, t))
    if waiting > 0 and t0 is not None and end > t0:
        spans.append((t0, end))
    starts = [a for a, _ in spans]
    prefix = [0.0]
    for a, b in spans:
        prefix.append(prefix[-1] + b - a)
    def covered(x):  # waiting seconds in [since, x)
        i = bisect.bisect_right(starts, x)
        if i == 0:
            return 0.0
        a, b = spans[i - 1]
        return prefix[i - 1] + min(x, b) - a
    by_class = [0.0] * len(GAP_CLASSES)
    seen = 0
    def gap(a, b, length):
        a, b = max(a, since), min(b, end)
        if b <= a:
            return
        w = covered(b) - covered(a)
        for k, (limit, _) in enumerate(GAP_CLASSES):
            if length < limit:
                by_class[k] += w
                return
    gpus = {}
    for line in open(f"{tmp}/{r}.gpus"):
        g, a, b = line.split()
        gpus.setdefault(g, []).append((float(a), float(b)))
    for ivs in gpus.values():
        seen += 1
        at = since
        for a, b in ivs:
            if a > at:
                # A gap that began before the window is counted whole.
                gap(at, a, a - at if at > since else float("inf"))
            at = max(at, b)
        gap(at, end, float("inf"))
    # GPUs with no allocation in the window were idle throughout.
    gap_all = max(0, sched - seen) * (covered(end) - covered(since))
    by_class[-1] += gap_all
    total = covered(end) * sched
    return total, by_class

def integrate(series, sched):
    """series: sorted (t, d_alloc, d_wait, d_gpu); returns the figures."""
    alloc = waiting = 0
    sizes = {}
    t0 = since
    acc = {"wait_s": 0.0, "alloc": 0.0, "below95_s": 0.0, "fit_s": 0.0, "fit_alloc": 0.0, "low": 100.0}
    for t, da, dw, dg in series + [(end, 0, 0, 0)]:
        t = min(max(t, since), end)
        dt = t - t0
        if dt > 0 and waiting > 0:
            pct = 100.0 * alloc / sched
            acc["wait_s"] += dt
            acc["alloc"] += pct * dt
            if pct < 95:
                acc["below95_s"] += dt
            acc["low"] = min(acc["low"], pct)
            smallest = min(g for g, k in sizes.items() if k > 0)
            if smallest <= sched - alloc:
                acc["fit_s"] += dt
                acc["fit_alloc"] += pct * dt
        t0 = max(t0, t)
        alloc += da
        waiting += dw
        if dg:
            sizes[abs(dg)] = sizes.get(abs(dg), 0) + (1 if dg > 0 else -1)
    return acc

def show(name, acc, fits=True):
    w = acc["wait_s"]
    if w == 0:
        print(f"{name:<11} no job waited over the grace")
        return
    fit = (f"{acc['fit_alloc'] / acc['fit_s']:.1f} % over {acc['fit_s']:.0f} s"
           if acc["fit_s"] else "never")
    print(f"{name:<11} work waited {w:.0f} s: allocation {acc['alloc'] / w:.1f} % (time-weighted), "
          f"lowest {acc['low']:.1f} %, below 95 % for {acc['below95_s']:.0f} s"
          + (f"; while a job no larger than the free GPUs waited: {fit}" if fits else ""))

print(f"allocation while work waited (a job queued over {grace:g} s), from the databases' records:")
fleet_allocs, fleet_sched = [], 0
for i, r in enumerate(regions):
    sched, ev = load(r)
    show(r, integrate(ev, sched))
    total, by_class = idle_gaps(r, ev, sched)
    if total:
        print(f"{'':<11} idle while work waited, by each GPU's gap: " + ", ".join(
            f"{label} {100 * s / total:.1f} pt" for (_, label), s in zip(GAP_CLASSES, by_class)))
    fleet_sched += sched
    fleet_allocs += [e for e in ev if e[1]]
if len(regions) > 1:
    fleet_events = list(fleet_allocs)
    for created, placed, g in fleet_jobs.values():
        start, stop = created + grace, min(end, placed)
        if stop > start:
            fleet_events += [(start, 0, 1, g), (stop, 0, -1, -g)]
    # A job fits only its own region's free GPUs: no "fits" figure here.
    show("fleet", integrate(sorted(fleet_events), fleet_sched), fits=False)
PY
