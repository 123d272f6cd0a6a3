#!/bin/sh
# What isolating a worker costs at its start (docs/benchmarks.md): the
# command alone; dropped to a tenant's user with setpriv and a clean
# environment (env -i); and in the agent's whole sandbox chain (bwrap as
# root with the agent's flags, then setpriv, then env -i). Run as root,
# with bubblewrap and hyperfine installed (apt-get install bubblewrap
# hyperfine). It makes a system user gw-bench and /var/tmp/gw-bench.
set -eu
id -u gw-bench >/dev/null 2>&1 ||
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gw-bench
U=$(id -u gw-bench)
G=$(id -g gw-bench)
ROOT=/var/tmp/gw-bench
D=$ROOT/jobs/j/rank-0-attempt-1
mkdir -p "$D"
chmod 711 "$ROOT" "$ROOT/jobs" "$ROOT/jobs/j"
chown gw-bench: "$D"
chmod 700 "$D"
SANDBOX="bwrap --ro-bind / / --dev /dev --proc /proc --perms 1777 --tmpfs /tmp \
 --perms 1777 --tmpfs /dev/shm --tmpfs $ROOT --perms 0711 --dir $ROOT/jobs \
 --perms 0711 --dir $ROOT/jobs/j --bind $D $D --unshare-pid --unshare-ipc \
 --unshare-cgroup-try --new-session --die-with-parent --chdir $D --"
DROP="setpriv --reuid=$U --regid=$G --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all --"
hyperfine -N --warmup 20 --runs "${RUNS:-300}" \
    -n direct "sh -c true" \
    -n "user (setpriv, env -i)" "$DROP env -i PATH=/usr/bin:/bin sh -c true" \
    -n "sandbox (bwrap, setpriv, env -i)" "$SANDBOX $DROP env -i PATH=/usr/bin:/bin sh -c true"
