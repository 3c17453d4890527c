#!/usr/bin/env bash
# A single-node Slurm with accounting on localhost, for the tests of the Slurm path:
#   [SLURM_LOCAL_PORT=16817] slurm/local/up.sh DIR    (as root; installs the apt packages if
#                                                      they are missing)
#   export SLURM_CONF=DIR/slurm.conf
#   ... sbatch / srun / squeue / sacct / python -m experiments.train -m hydra/launcher=slurm ...
#   slurm/local/down.sh DIR
# `make slurm-up` / `make slurm-down` run these with DIR = SLURM_DIR (default
# /tmp/scorelib-slurm) and pass SLURM_LOCAL_PORT on: make slurm-up SLURM_LOCAL_PORT=16917.
# Directory: DIR holds slurm.conf and slurmdbd.conf, the controller's state (DIR/state), the
# spool (DIR/spool), the logs (DIR/log) and the pid files (DIR/run); the accounting database
# lives in /tmp/scorelib-slurm-mysql.XXXXXX (linked as DIR/mysql). down.sh removes both.
# Ports: SLURM_LOCAL_PORT (default 16817) slurmctld, +1 slurmd, +2 slurmdbd, +3 mariadbd.
# Daemons: munged (if not already running), mariadbd, slurmdbd, slurmctld, slurmd. The node
# advertises 8 CPUs (SLURM_LOCAL_CPUS) whatever the machine has, so that a job can ask for
# several tasks.
# One local Slurm per directory and per port range: a second one in the same DIR, or on a
# port that is taken, is refused before anything starts (exit 2, one line naming a free
# SLURM_LOCAL_PORT); a second one on the same machine needs its own DIR and
# SLURM_LOCAL_PORT (the Slurm tests pick free ports themselves).
set -euo pipefail
DIR=$(realpath -m "${1:?usage: [SLURM_LOCAL_PORT=16817] up.sh STATE_DIR}")
PORT=${SLURM_LOCAL_PORT:-16817}
CPUS=${SLURM_LOCAL_CPUS:-8}
HOST=$(hostname -s)

refuse() { echo "up.sh: $*" >&2; exit 2; }
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1024 ] && [ "$PORT" -le 65532 ] \
    || refuse "SLURM_LOCAL_PORT must be an integer in [1024, 65532] (it uses 4 ports); got '$PORT'"

# --- a local Slurm already running here? (checked before anything starts; needs no root)
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
ports_free() { local p; for p in $(seq "$1" $(($1 + 3))); do ! listening "$p" || return 1; done; }
free_port() {  # the first base port, in steps of 100 above PORT, whose 4 ports are free
    local p
    for p in $(seq $((PORT + 100)) 100 65432); do ports_free "$p" && { echo "$p"; return; }; done
    echo "<a free port>"
}
running_in_dir() {  # "slurmctld pid 123" for the first live daemon of DIR's pid files
    local name pid
    for name in slurmctld slurmd slurmdbd; do
        pid=$(cat "$DIR/run/$name.pid" 2>/dev/null) || continue
        [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = "$name" ] && { echo "$name pid $pid"; return; }
    done
    return 1
}
if live=$(running_in_dir); then
    other=$(free_port)
    refuse "a local Slurm already runs in $DIR ($live): stop it with slurm/local/down.sh" \
        "$DIR (make slurm-down), or start a second one with its own directory and ports," \
        "e.g. make slurm-up SLURM_LOCAL_PORT=$other SLURM_DIR=/tmp/scorelib-slurm-$other"
fi
for p in $(seq "$PORT" $((PORT + 3))); do
    if listening "$p"; then
        other=$(free_port)
        refuse "port $p is in use (this Slurm takes SLURM_LOCAL_PORT=$PORT to $((PORT + 3)):" \
            "another local Slurm?); pick other ports, e.g. make slurm-up" \
            "SLURM_LOCAL_PORT=$other SLURM_DIR=/tmp/scorelib-slurm-$other"
    fi
done

[ "$(id -u)" = 0 ] || { echo "up.sh: must run as root (starts daemons)" >&2; exit 2; }
if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null \
    || ! command -v mariadbd >/dev/null || ! command -v munged >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm slurmdbd munge \
        mariadb-server >/dev/null
fi

mkdir -p "$DIR"/{state,spool,log,run}
# the database lives where user mysql can reach it (DIR's parents may be private)
MYSQL=$(mktemp -d /tmp/scorelib-slurm-mysql.XXXXXX)
chown mysql:mysql "$MYSQL"
ln -sfn "$MYSQL" "$DIR/mysql"

# munge: the authentication every Slurm daemon and client uses
if ! munge -n >/dev/null 2>&1; then
    mkdir -p /run/munge && chown munge:munge /run/munge
    runuser -u munge -- /usr/sbin/munged
    touch "$DIR/run/started-munged"
    for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
fi

# accounting database (submitit reads job states with sacct)
mariadb-install-db --user=mysql --datadir="$MYSQL/data" --auth-root-authentication-method=socket \
    >"$DIR/log/mariadb-install.log" 2>&1
runuser -u mysql -- mariadbd --datadir="$MYSQL/data" --socket="$MYSQL/mysql.sock" \
    --pid-file="$MYSQL/mariadbd.pid" --port=$((PORT + 3)) --bind-address=127.0.0.1 \
    --skip-log-bin --innodb-buffer-pool-size=32M </dev/null >"$MYSQL/mariadbd.log" 2>&1 &
for _ in $(seq 100); do [ -S "$MYSQL/mysql.sock" ] && break; sleep 0.1; done
mariadb --socket="$MYSQL/mysql.sock" -u root <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL

cat >"$DIR/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$((PORT + 2))
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((PORT + 3))
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/run/slurmdbd.pid
CONF
chmod 600 "$DIR/slurmdbd.conf"

MEM=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 1024 ))
cat >"$DIR/slurm.conf" <<CONF
ClusterName=scorelib
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$((PORT + 2))
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerParameters=defer_batch
MinJobAge=300
KillWait=5
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$DIR/slurm.conf"

slurmdbd  # reads slurmdbd.conf beside $SLURM_CONF
for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.1; done
sacctmgr -i add cluster scorelib >/dev/null 2>&1 || true
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 200); do
    state=$(sinfo -h -N -o %T 2>/dev/null | head -1)
    [ "$state" = idle ] && break
    sleep 0.1
done
[ "$state" = idle ] || { echo "up.sh: node not idle ($state); logs in $DIR/log" >&2; exit 1; }
echo "export SLURM_CONF=$SLURM_CONF"
