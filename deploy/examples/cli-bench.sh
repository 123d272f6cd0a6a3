#!/usr/bin/env bash
# `gangway job submit` against Slurm's `sbatch --hold`, side by side on one
# machine (issue 23; docs/benchmarks.md "The CLI against sbatch"): one call
# at a time, then 8 shells submitting at once. Needs a running
# `gangway dev up` (its state dir) and, for the Slurm half, Debian's
# `slurm-wlm` and `munge` (apt-get install slurm-wlm munge): this script
# sets up a one-node slurmctld of its own in /tmp/gw-slurm (no slurmd: held
# jobs only queue) and stops it at the end. SLURM=0 skips Slurm. Gangway's
# scheduling is held off meanwhile (as submit-bench.sh does), so that both
# only accept and keep jobs, and its queue is emptied first.
#
#   deploy/examples/cli-bench.sh /tmp/gw-bench [calls-in-a-row] [calls-per-shell]
#
# Each figure is the wall time of one whole command (process start, TLS,
# the request) from the shell's point of view, and its CPU time (user +
# system, `perf stat`'s task-clock: apt-get install linux-perf). At 8
# shells it also says where the machine's CPU went per call: the servers
# (slurmctld and munged; Gangway's global replica, regions and PostgreSQL)
# and the rest (the clients themselves, their shells, the kernel).
set -euo pipefail
STATE=${1:?state dir of a running gangway dev up}
IN_A_ROW=${2:-50}
PER_SHELL=${3:-100}
SHELLS=${SHELLS:-8}
GANGWAY=$(readlink -f "${GANGWAY:-target/release/gangway}")
# shellcheck source=deploy/examples/dev-cloud.sh
source "$(dirname "$0")/dev-cloud.sh"
export GANGWAY_STATE_DIR=$STATE
OUT=$(mktemp -d)
# The CLI goes to a global replica without dev up's rate limit (200
# requests/s a tenant), as a real cloud's limit would be set for it.
BENCH_PORT=${BENCH_PORT:-18463}
bench_global "$BENCH_PORT"
trap 'kill $BENCH_PID 2>/dev/null; release_scheduling' EXIT
export GANGWAY_URL=https://127.0.0.1:$BENCH_PORT

slurm_up() {
    local d=/tmp/gw-slurm
    mkdir -p $d/state $d/log /etc/slurm /run/munge
    [ -f /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
    chown -R munge:munge /etc/munge /run/munge 2>/dev/null || true
    chmod 0400 /etc/munge/munge.key
    pgrep -x munged >/dev/null || su -s /bin/sh munge -c "/usr/sbin/munged" 2>/dev/null || /usr/sbin/munged -f
    cat >/etc/slurm/slurm.conf <<EOF
ClusterName=gwbench
SlurmctldHost=localhost
SlurmUser=root
StateSaveLocation=$d/state
SlurmctldLogFile=$d/log/slurmctld.log
SlurmctldPidFile=$d/slurmctld.pid
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
SchedulerType=sched/backfill
SelectType=select/cons_tres
ReturnToService=2
MaxJobCount=1000000
NodeName=localhost CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    pkill -x slurmctld 2>/dev/null || true
    sleep 1
    slurmctld -i
    for _ in $(seq 30); do scontrol ping 2>/dev/null | grep -q UP && return; sleep 1; done
    echo "slurmctld did not come up; see $d/log/slurmctld.log" >&2
    exit 1
}

# Slurm's daemons start before the hold below: a daemon started after it
# would inherit the hold's pipe ends and keep its sessions (and the
# regions' leader locks) past the script's end.
if [ "${SLURM:-1}" != 0 ]; then
    slurm_up
fi
# As `sbatch --hold`: jobs are accepted and kept, not scheduled, and the
# cloud is idle before each half.
hold_scheduling

# One command, timed from the shell (bash's $EPOCHREALTIME: no fork to
# read the clock): its wall time in ms appended to $1.
timed() {
    local out=$1 t0 t1
    shift
    t0=$EPOCHREALTIME
    "$@" >/dev/null 2>"$OUT/err.$BASHPID" ||
        { echo "failed: $* ($(tail -1 "$OUT/err.$BASHPID"))" >&2; return 1; }
    t1=$EPOCHREALTIME
    echo "$t0 $t1" | awk '{printf "%.2f\n", ($2 - $1) * 1000}' >>"$out"
}

# One command's CPU time in ms (user + system: `perf stat`'s task-clock),
# appended to $1.
cpu() {
    local out=$1
    shift
    perf stat -x, -e task-clock -o "$OUT/cpu.$BASHPID" "$@" >/dev/null 2>&1
    awk -F, '/task-clock/ {printf "%.2f\n", $1}' "$OUT/cpu.$BASHPID" >>"$out"
}

summary() { # name, file of wall times, seconds (for a rate) or "", file of CPU times or ""
    python3 - "$@" <<'EOF'
import sys, statistics
name, path, secs, cpu = (sys.argv[1:] + ["", ""])[:4]
w = sorted(float(l) for l in open(path) if l.strip())
q = lambda p: w[min(len(w) - 1, int(p * len(w)))]
rate = f", {len(w) / float(secs):.0f} /s" if secs else ""
c = f"; CPU median {statistics.median(float(l) for l in open(cpu) if l.strip()):.1f} ms" if cpu else ""
print(f"{name:40s} {len(w):5d} calls{rate}: wall p50 {q(0.5):.1f} ms, p90 {q(0.9):.1f} ms, "
      f"p99 {q(0.99):.1f} ms{c}")
EOF
}

run_both() { # label, command...
    local label=$1 f
    shift
    f="$OUT/${label// /-}.row"
    for _ in $(seq "$IN_A_ROW"); do timed "$f" "$@"; done
    for _ in $(seq "$IN_A_ROW"); do cpu "$f.cpu" "$@"; done
    summary "$label, one at a time" "$f" "" "$f.cpu"
    f="$OUT/${label// /-}.par"
    local t0 t1 before after
    before="$(busy_ticks) $(servers)"
    t0=$EPOCHREALTIME
    local shells=()
    for s in $(seq "$SHELLS"); do
        (for _ in $(seq "$PER_SHELL"); do timed "$f.$s" "$@"; done) &
        shells+=($!)
    done
    wait "${shells[@]}"
    t1=$EPOCHREALTIME
    after="$(busy_ticks) $(servers)"
    cat "$f".[0-9]* >"$f"
    summary "$label, $SHELLS shells at once" "$f" "$(echo "$t0 $t1" | awk '{print $2 - $1}')"
    # Where the machine's CPU went, per call: the servers' processes, and
    # the rest (the clients, their shells, the kernel's threads).
    python3 - "$before" "$after" "$HZ" "$(wc -l <"$f")" "$SERVER_NAMES" <<'EOF'
import sys
b, a, hz, n, names = sys.argv[1].split(), sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(",")
ms = [(int(y) - int(x)) / hz * 1000 / max(n, 1) for x, y in zip(b, a)]
parts = " / ".join(f"{name} {v:.2f}" for name, v in zip(names, ms[1:]))
print(f"{'':40s} CPU ms per call: all {ms[0]:.2f} = {parts} / the rest (clients, shells, kernel) {ms[0] - sum(ms[1:]):.2f}")
EOF
}

if [ "${SLURM:-1}" != 0 ]; then
    servers() { ticks $(pgrep -x slurmctld) $(pgrep -x munged); }
    SERVER_NAMES="slurmctld and munged"
    run_both "sbatch --hold" sbatch --hold --wrap true
    scancel --user root --state PENDING 2>/dev/null || true
fi
for r in "${REGIONS[@]}"; do clear_queue "$r"; done
servers() { echo "$(ticks "$BENCH_PID") $(ticks $(region_pids)) $(ticks $(pg_pids))"; }
SERVER_NAMES="global,regions,PostgreSQL"
run_both "gangway job submit" "$GANGWAY" job submit --gpus 1 --gpu-type h100 -- true
if [ "${SLURM:-1}" != 0 ]; then
    pkill -x slurmctld || true
fi
rm -rf "$OUT"
