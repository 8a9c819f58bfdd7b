#!/usr/bin/env bash
# A real single-node SLURM on this machine, for tests/slurm (run as root; no systemd needed).
#
#   cluster/slurm-test/setup.sh          install (apt) if missing, configure, start, wait for idle
#   cluster/slurm-test/setup.sh stop     scontrol shutdown, then stop munged
#
# Idempotent: a second run with the daemons up only re-checks them. The node is called
# `localhost` (NodeAddr 127.0.0.1) and advertises this host's cores (at least 8, so a 4-worker
# test fits: SlurmdParameters=config_overrides lets slurmd run with more CPUs than it sees) and
# about 3/4 of its memory. Partition `debug` is the default; DefMemPerCPU keeps a job without
# --mem from taking the whole node. See notes: slurm-single-node.md.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
WAIT_S="${FLOWRL_SLURM_WAIT_S:-60}"

log() { echo "[slurm-setup] $*" >&2; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out after ${limit}s waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}

if [[ "${1:-}" == "stop" ]]; then
  scontrol shutdown >/dev/null 2>&1 || true
  if [[ -f /run/munge/munged.pid ]]; then kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true; fi
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  log "must run as root (it installs packages and starts slurmctld/slurmd)"
  exit 1
fi

# 1. packages
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sinfo >/dev/null \
   || ! command -v munged >/dev/null; then
  log "installing slurmctld slurmd slurm-client munge"
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

# 2. munge
if [[ ! -s /etc/munge/munge.key ]]; then
  mungekey --create >/dev/null 2>&1 || mungekey -c
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
fi
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged
  wait_for "$WAIT_S" "munged" bash -c 'munge -n | unmunge'
fi

# 3. slurm.conf for this host
cpus=$(nproc --all)
((cpus < 8)) && cpus=8
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 3 / 4)}' /proc/meminfo)
((mem_mb < 4000)) && mem_mb=4000
def_mem=$((mem_mb / cpus / 2))
((def_mem > 2000)) && def_mem=2000
install -d "$CONF_DIR" /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm /run/slurm
new_conf=$(cat <<EOF
# Written by flowrl cluster/slurm-test/setup.sh: a single-node SLURM for tests.
ClusterName=flowrl-test
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
KillWait=5
MinJobAge=5
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmdSpoolDir=/var/lib/slurm/slurmd
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP DefMemPerCPU=$def_mem
EOF
)
if [[ ! -f "$CONF" ]] || [[ "$(cat "$CONF")" != "$new_conf" ]]; then
  log "writing $CONF (CPUs=$cpus RealMemory=${mem_mb}MB)"
  printf '%s\n' "$new_conf" >"$CONF"
  if scontrol ping 2>/dev/null | grep -q UP; then  # node changes need a restart, not reconfigure
    log "restarting slurmctld and slurmd for the new configuration"
    scontrol shutdown >/dev/null 2>&1 || true
    wait_for "$WAIT_S" "slurmctld and slurmd to stop" bash -c '! pgrep -x slurmctld && ! pgrep -x slurmd'
  fi
fi

# 4. daemons, readiness by commands (not pids)
if ! scontrol ping 2>/dev/null | grep -q UP; then
  log "starting slurmctld"
  slurmctld
  wait_for "$WAIT_S" "slurmctld (scontrol ping)" bash -c 'scontrol ping | grep -q UP'
fi
node_state() { sinfo -h -n localhost -o %T 2>/dev/null | head -1; }
if ! pgrep -x slurmd >/dev/null; then
  log "starting slurmd"
  slurmd -N localhost
fi
state=$(node_state)
if [[ "$state" == down* || "$state" == drain* ]]; then
  scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
fi
wait_for "$WAIT_S" "node localhost to be idle (sinfo)" bash -c \
  'sinfo -h -n localhost -o %T | grep -Eq "^(idle|mixed|allocated)"'
log "ready: $(sinfo -h -o '%P %D %T %c CPUs %m MB')"
