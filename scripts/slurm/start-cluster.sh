#!/usr/bin/env bash
# Start a small but real SLURM cluster on this machine for llmtrain's tests and demos:
# munged, slurmctld and two slurmd node daemons (n1, n2), all on 127.0.0.1.
#
# Needs root and apt (Debian 12: slurm-wlm 22.05). Installs missing packages with
# apt-get --no-install-recommends. Everything lives under $LLMTRAIN_SLURM_DIR
# (default /tmp/llmtrain-slurm-cluster): config, state, logs, pid files.
# Clients (sbatch, squeue, llmtrain submit) need:  export SLURM_CONF=$LLMTRAIN_SLURM_DIR/etc/slurm.conf
#
# Settings (environment): NODES (default 2), CPUS per node (default: the CPUs this process may
# run on, as nproc counts them without OMP_NUM_THREADS, which GNU nproc would return instead),
# PARTITION (default debug), WAIT_S (default 60).
# Running it again while the cluster is up with the same settings only checks it.
# Stop with scripts/slurm/stop-cluster.sh.
set -euo pipefail

DIR=${LLMTRAIN_SLURM_DIR:-/tmp/llmtrain-slurm-cluster}
NODES=${NODES:-2}
CPUS=${CPUS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
PARTITION=${PARTITION:-debug}
WAIT_S=${WAIT_S:-60}
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
export SLURM_CONF=$DIR/etc/slurm.conf

say() { echo "start-cluster: $*"; }
die() { echo "start-cluster: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (slurmd runs jobs as any user; SlurmUser=root here)"

# A live process from a pid file, checked by its command name (a stale pid file never matches).
alive() {  # alive PIDFILE NAME
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

# -- packages ------------------------------------------------------------------
need=()
for pkg in munge slurmctld slurmd slurm-client; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "slurm is not installed and apt-get is not available"
  mkdir -p "$DIR/log"
  say "installing ${need[*]} (apt-get, see $DIR/log/apt.log)"
  # Keep the packages' maintainer scripts from starting the distribution's own daemons.
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  ok=1
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends "${need[@]}"; } >"$DIR/log/apt.log" 2>&1 || ok=0
  [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$ok" = 1 ] || { tail -n 20 "$DIR/log/apt.log" >&2; die "apt-get install failed"; }
fi

# -- configuration ---------------------------------------------------------------
mkdir -p "$DIR"/{etc,log,state,spool,munge}
chmod 755 "$DIR" "$DIR/munge"   # munged refuses a socket directory others can write to or not enter
if [ ! -s "$DIR/munge/munge.key" ]; then
  head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
fi
chmod 400 "$DIR/munge/munge.key"

mem_mb=$(( $(awk '/^MemTotal/ {print $2}' /proc/meminfo) / 1024 / NODES ))
last_port=$(( 17100 + NODES ))
conf=$(cat <<CONF
# Written by llmtrain scripts/slurm/start-cluster.sh: $NODES nodes on 127.0.0.1.
ClusterName=llmtrain
SlurmctldHost=localhost
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
# No systemd, no cgroups: track processes by their parent chain. task/affinity binds each task
# to the CPUs it was given (sched_setaffinity, no cgroup needed), so a job sees what it asked.
# The nodes share this machine's CPUs: each counts its own from CPU 0.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Start jobs at once (the default batch delay keeps them pending for seconds).
SchedulerParameters=batch_sched_delay=0
# Without accounting, finished jobs stay visible to scontrol for a day.
MinJobAge=86400
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
KillWait=5
SlurmdParameters=config_overrides
NodeName=n[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=17101-$last_port CPUs=$CPUS RealMemory=$mem_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
)

daemons_alive() {
  alive "$DIR/munge/munged.pid" munged && alive "$DIR/slurmctld.pid" slurmctld || return 1
  for i in $(seq 1 "$NODES"); do alive "$DIR/slurmd-n$i.pid" slurmd || return 1; done
}

if [ -f "$SLURM_CONF" ] && [ "$(cat "$SLURM_CONF")" = "$conf" ] && daemons_alive; then
  say "already running"
else
  # A different configuration or a missing daemon: restart from a clean state.
  [ -f "$SLURM_CONF" ] && "$(dirname "$0")/stop-cluster.sh" >/dev/null 2>&1 || true
  printf '%s\n' "$conf" >"$SLURM_CONF"
  # slurmd always loads a cgroup plugin; the default (autodetect) fails on cgroup2 or an
  # empty /sys/fs/cgroup. The v1 plugin loads without touching anything (nothing uses it).
  echo "CgroupPlugin=cgroup/v1" >"$DIR/etc/cgroup.conf"
  rm -rf "${DIR:?}/state/"*

  alive "$DIR/munge/munged.pid" munged || munged \
    --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed"
  slurmctld -c
  for i in $(seq 1 "$NODES"); do
    mkdir -p "$DIR/spool/n$i"
    slurmd -N "n$i"
  done
fi

# -- wait until every node is idle -----------------------------------------------
deadline=$(( $(date +%s) + WAIT_S ))
until [ "$(sinfo -h -o '%T' 2>/dev/null | sort -u | tr '\n' ' ')" = "idle " ]; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    tail -n 20 "$DIR"/log/slurm*.log >&2 || true
    die "nodes not idle after ${WAIT_S}s: $(sinfo -h -N -o '%N=%T' 2>&1 | tr '\n' ' ')"
  fi
  sleep 0.2
done
say "up: $(sinfo -h -N -o '%N' | tr '\n' ' ')(export SLURM_CONF=$SLURM_CONF)"
