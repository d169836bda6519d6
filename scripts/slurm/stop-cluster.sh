#!/usr/bin/env bash
# Stop the cluster scripts/slurm/start-cluster.sh started: cancel its jobs, then stop the
# daemons named by its pid files (nothing else). --purge also removes $LLMTRAIN_SLURM_DIR.
set -uo pipefail

DIR=${LLMTRAIN_SLURM_DIR:-/tmp/llmtrain-slurm-cluster}
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
export SLURM_CONF=$DIR/etc/slurm.conf

alive() {  # alive PIDFILE NAME -> prints the pid of a live process of that name
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] && echo "$pid"
}

# Jobs first: their steps (slurmstepd and the job's processes) outlive slurmd.
if alive "$DIR/slurmctld.pid" slurmctld >/dev/null; then
  jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null
    for _ in $(seq 150); do
      [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
fi

pids=()
for f in "$DIR"/slurmd-*.pid; do p=$(alive "$f" slurmd) && pids+=("$p"); done
p=$(alive "$DIR/slurmctld.pid" slurmctld) && pids+=("$p")
p=$(alive "$DIR/munge/munged.pid" munged) && pids+=("$p")
if [ ${#pids[@]} -gt 0 ]; then
  kill -TERM "${pids[@]}" 2>/dev/null
  for _ in $(seq 100); do
    left=()
    for p in "${pids[@]}"; do
      [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || echo Z)" != Z ] && left+=("$p")
    done
    [ ${#left[@]} -eq 0 ] && break
    sleep 0.1
  done
  [ ${#left[@]} -gt 0 ] && kill -KILL "${left[@]}" 2>/dev/null
fi
rm -f "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"
[ "${1:-}" = --purge ] && rm -rf "$DIR"
echo "stop-cluster: stopped ${#pids[@]} daemon(s)"
