#!/usr/bin/env bash
# Stop the daemons that slurm/local/up.sh DIR started (by their pid files) and remove DIR.
set -uo pipefail
DIR=$(realpath -m "${1:?usage: down.sh STATE_DIR}")
[ -d "$DIR" ] || exit 0
export SLURM_CONF="$DIR/slurm.conf"
scancel --user=root >/dev/null 2>&1 || true
stop() {  # stop PIDFILE: TERM, wait up to 10 s, then KILL
    [ -f "$1" ] || return 0
    local pid; pid=$(cat "$1")
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}
stop "$DIR/run/slurmd.pid"
stop "$DIR/run/slurmctld.pid"
stop "$DIR/run/slurmdbd.pid"
stop "$DIR/mysql/mariadbd.pid"
# munged is shared: stop the one this Slurm started only when no other Slurm daemon uses it
if [ -f "$DIR/run/started-munged" ] && ! pgrep -x 'slurm(ctld|d|dbd)' >/dev/null; then
    stop /run/munge/munged.pid
fi
MYSQL=$(readlink "$DIR/mysql" || true)
case "$MYSQL" in /tmp/scorelib-slurm-mysql.*) rm -rf "$MYSQL" ;; esac
rm -rf "$DIR"
