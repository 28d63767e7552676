#!/usr/bin/env bash
# A one-host SLURM cluster for tests and demos: munge, slurmctld and slurmd on this machine,
# one default partition `tuneyard` with all of its CPUs. Idempotent: an already running
# cluster is left as it is. Needs root (the daemons and /etc/slurm); Debian packages.
#   bash deploy/slurm/local-cluster.sh          # install when missing, configure, start
#   sinfo; squeue                               # check it
set -euo pipefail

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq slurm-wlm munge >/dev/null; }
fi

if scontrol ping 2>/dev/null | grep -q "is UP" && sinfo -h -o %T 2>/dev/null | grep -qE "idle|mix|alloc"; then
  echo "slurm: already up"; exit 0
fi

# munge: its key and run directories owned by the munge user, the daemon run as that user.
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c "/usr/sbin/munged"

host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
chown slurm:slurm /var/spool/slurmctld /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=tuneyard
SlurmctldHost=${host}
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
# Ended jobs stay visible to scontrol for a while (there is no slurmdbd, so no sacct).
MinJobAge=600
KillWait=10
JobRequeue=1
NodeName=${host} CPUs=${cpus} RealMemory=${mem_mb} State=UNKNOWN
PartitionName=tuneyard Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
rm -f /etc/slurm/cgroup.conf  # proctrack/linuxproc + task/none: no cgroups needed

pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd || { tail -n 20 /var/log/slurm/slurmd.log >&2; exit 1; }
for _ in $(seq 1 30); do
  if sinfo -h -o %T 2>/dev/null | grep -qE "idle|mix|alloc"; then
    echo "slurm: up ($(sinfo -h -o '%P %D %C'))"; exit 0
  fi
  scontrol update NodeName="${host}" State=RESUME >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm: did not come up; see /var/log/slurm/" >&2
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
