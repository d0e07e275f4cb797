#!/usr/bin/env bash
# A throw-away, single-node Slurm "cluster" on this machine, for testing mpi_jobs/slurm_train.sbatch.
#
# Not something to use on a real cluster: it runs every daemon as root, on localhost, from a
# private directory, and leaves /etc/slurm and /etc/munge alone.
#
# Usage (as root):
#   mpi_jobs/local_slurm.sh install          apt-get install slurm-wlm + munge if slurmctld is missing
#                                            (apt-get update first only if apt does not know slurm-wlm)
#   mpi_jobs/local_slurm.sh up DIR           write DIR/slurm.conf, start munged, slurmctld and slurmd
#                                            with all their state, sockets and logs under DIR, wait
#                                            until the node is idle; prints "SLURM_CONF=DIR/slurm.conf"
#   mpi_jobs/local_slurm.sh down DIR         cancel the jobs, stop the daemons that `up DIR` started
#                                            (by the PIDs it recorded, never by name), kill leftover
#                                            job processes (recognised by SLURM_CONF=DIR/slurm.conf
#                                            in their environment) and remove DIR; safe to repeat
#   mpi_jobs/local_slurm.sh run [SBATCH ARGS...]
#                                            install + up (in a new temporary directory) +
#                                            `sbatch --wait SBATCH ARGS...` + down, with the teardown
#                                            in an EXIT trap so it also happens on failure
#
# Clients then need SLURM_CONF=DIR/slurm.conf in their environment, e.g.
#   SLURM_CONF=DIR/slurm.conf sbatch --wait --output=out.txt mpi_jobs/slurm_train.sbatch --epochs 1
#
# Environment:
#   LOCAL_SLURM_AUTH   munge (default) or none. munge: a fresh 1 KiB key is generated in DIR and a
#                      private munged serves DIR/munge/munge.socket (AuthInfo=socket=...).
#                      none: auth/none (no munged), which Slurm 22.05 (Debian 12) still ships as
#                      auth_none.so; later Slurm releases may not have it.
#   LOCAL_SLURM_CPUS   CPUs of the node (default: the online CPUs, getconf _NPROCESSORS_ONLN); a job
#                      asking for more tasks than this stays pending (Reason=PartitionConfig).
#   LOCAL_SLURM_WAIT   seconds to wait for the node to become idle (default 60).
#
# Configuration written (see write_conf below): SlurmctldHost=<hostname -s>(127.0.0.1), one node
# NodeName=<hostname -s> NodeAddr=127.0.0.1 CPUs=<online CPUs>, one default partition "debug",
# ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, SelectType=select/cons_tres with
# CR_CPU, MpiDefault=none, no accounting, SlurmUser=root, randomly chosen free TCP ports.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin  # slurmctld, slurmd and munged live in sbin

SLURM_PKGS=(slurm-wlm munge)

die() { echo "local_slurm: $*" >&2; exit 1; }
log() { echo "local_slurm: $*" >&2; }

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root (the daemons run as root here)"; }

has_candidate() {  # apt knows an installable version of package $1
  local policy
  policy=$(apt-cache policy "$1" 2>/dev/null) || return 1
  [[ $policy =~ Candidate:\ [0-9] ]]
}

cmd_install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
     && command -v munged >/dev/null; then
    return 0
  fi
  need_root
  command -v apt-get >/dev/null || die "slurmctld is missing and there is no apt-get to install it"
  # Refresh the package lists only if the package is unknown to apt.
  if ! has_candidate slurm-wlm; then
    log "slurm-wlm unknown to apt; running apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed"
  fi
  has_candidate slurm-wlm \
    || die "no installable slurm-wlm package (apt-cache policy slurm-wlm has no candidate)"
  log "installing ${SLURM_PKGS[*]}"
  # policy-rc.d in containers keeps the packaged services from starting; we start our own anyway.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${SLURM_PKGS[@]}" >&2 \
    || die "apt-get install ${SLURM_PKGS[*]} failed"
  command -v slurmctld >/dev/null || die "slurmctld still missing after installing ${SLURM_PKGS[*]}"
}

port_free() {  # nothing listens on, or connects from, TCP port $1
  if command -v ss >/dev/null; then
    [[ -z $(ss -Htan "( sport = :$1 )" 2>/dev/null) ]]
  else
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}

pick_port() {  # a free TCP port in 20000-29999 (below Linux's ephemeral range), not one of "$@"
  local p taken=" $* "
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 10000))
    [[ $taken == *" $p "* ]] && continue
    port_free "$p" && { echo "$p"; return 0; }
  done
  die "no free TCP port found"
}

write_conf() {
  local dir=$1 auth=$2 host cpus ctl_port d_port srun_lo
  host=$(hostname -s)
  # not plain `nproc`: it obeys OMP_NUM_THREADS, which launch environments often set to 1
  cpus=${LOCAL_SLURM_CPUS:-$(getconf _NPROCESSORS_ONLN)}
  ctl_port=$(pick_port)
  d_port=$(pick_port "$ctl_port")
  srun_lo=$(( (RANDOM % 27) * 100 + 30000 ))  # srun's own listening ports: 100 in 30000-32699
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  : >"$dir/plugstack.conf"
  {
    echo "# generated by mpi_jobs/local_slurm.sh for a single-node test cluster"
    echo "ClusterName=localtest"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$ctl_port"
    echo "SlurmdPort=$d_port"
    echo "SrunPortRange=$srun_lo-$((srun_lo + 99))"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmdPidFile=$dir/slurmd.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd.log"
    echo "SlurmctldDebug=info"
    echo "SlurmdDebug=info"
    echo "MailProg=/bin/true"
    echo "PlugStackConfig=$dir/plugstack.conf"
    if [[ $auth == munge ]]; then
      echo "AuthType=auth/munge"
      echo "CredType=cred/munge"
      echo "AuthInfo=socket=$dir/munge/munge.socket"
    else
      echo "AuthType=auth/none"
      echo "CredType=cred/none"
    fi
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "MpiDefault=none"
    echo "SwitchType=switch/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "SlurmdParameters=config_overrides"  # trust CPUs= below even if it exceeds the hardware
    echo "ReturnToService=2"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=30"
    echo "InactiveLimit=0"
    echo "KillWait=5"
    echo "MinJobAge=300"
    echo "NodeName=$host NodeAddr=127.0.0.1 NodeHostname=$host CPUs=$cpus State=UNKNOWN"
    echo "PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } >"$dir/slurm.conf"
  echo "$host" >"$dir/nodename"
}

start_bg() {  # start_bg DIR NAME CMD...: run CMD in the foreground mode of the daemon, in background
  local dir=$1 name=$2; shift 2
  "$@" >>"$dir/log/$name.out" 2>&1 </dev/null &
  echo $! >"$dir/$name.mypid"
}

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# start_slurm DIR HOST WAIT_S: start slurmctld + slurmd, wait for the node to be idle; 1 on failure
start_slurm() {
  local dir=$1 host=$2 wait_s=$3 state=""
  start_bg "$dir" slurmctld slurmctld -D -c -i -f "$SLURM_CONF"
  sleep 1
  start_bg "$dir" slurmd slurmd -D -f "$SLURM_CONF" -N "$host"
  for _ in $(seq $((wait_s * 2))); do
    alive "$dir/slurmctld.mypid" || { log "slurmctld exited"; return 1; }
    alive "$dir/slurmd.mypid" || { log "slurmd exited"; return 1; }
    state=$(sinfo -h -N -n "$host" -o %T 2>/dev/null || true)
    [[ $state == idle* ]] && return 0
    sleep 0.5
  done
  log "node $host not idle after ${wait_s}s (state '${state:-unknown}')"
  return 1
}

cmd_up() {
  need_root
  local dir=${1:?usage: local_slurm.sh up DIR} auth=${LOCAL_SLURM_AUTH:-munge} wait_s=${LOCAL_SLURM_WAIT:-60}
  [[ $auth == munge || $auth == none ]] || die "LOCAL_SLURM_AUTH must be munge or none, not '$auth'"
  command -v slurmctld >/dev/null || die "slurmctld not installed (run: local_slurm.sh install)"
  mkdir -p "$dir"
  chmod 700 "$dir"
  dir=$(cd "$dir" && pwd)
  write_conf "$dir" "$auth"
  local host; host=$(cat "$dir/nodename")
  if [[ $auth == munge ]]; then
    mkdir -p "$dir/munge"
    chmod 711 "$dir/munge"  # munged wants the socket's directory searchable by all
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/munge/munge.key"
    start_bg "$dir" munged munged --foreground --force --socket="$dir/munge/munge.socket" \
      --key-file="$dir/munge/munge.key" --pid-file="$dir/munge/munged.pid" \
      --seed-file="$dir/munge/munged.seed" --log-file="$dir/log/munged.log"
    for _ in $(seq 50); do [[ -S $dir/munge/munge.socket ]] && break; sleep 0.2; done
    [[ -S $dir/munge/munge.socket ]] || { tail -n 20 "$dir"/log/munge* >&2; die "munged did not start"; }
    munge -S "$dir/munge/munge.socket" -n | unmunge -S "$dir/munge/munge.socket" >/dev/null \
      || die "munge round trip through $dir/munge/munge.socket failed"
  fi
  export SLURM_CONF=$dir/slurm.conf
  # Up to 3 tries: a port that was free when chosen may be taken by the time a daemon binds it.
  local try
  for try in 1 2 3; do
    if start_slurm "$dir" "$host" "$wait_s"; then break; fi
    stop_pidfile "$dir/slurmd.mypid"
    stop_pidfile "$dir/slurmctld.mypid"
    if [[ $try -lt 3 ]] && grep -qs "Address already in use" "$dir"/log/slurm*; then
      log "a port was taken; retrying with new ports"
      rm -rf "$dir/state" "$dir/spool" "$dir"/log/slurm*
      write_conf "$dir" "$auth"
      continue
    fi
    tail -n 30 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" "$dir"/log/*.out >&2 2>/dev/null || true
    die "Slurm did not come up (logs above, all logs in $dir/log)"
  done
  log "up: auth/$auth, node $host idle, SLURM_CONF=$SLURM_CONF"
  echo "SLURM_CONF=$SLURM_CONF"
}

stop_pidfile() {  # stop_pidfile FILE: TERM, wait up to 10 s, then KILL the recorded process
  local f=$1 pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

cmd_down() {
  local dir=${1:?usage: local_slurm.sh down DIR}
  [[ -d $dir ]] || return 0
  if [[ -f $dir/slurm.conf && -f $dir/slurmctld.mypid ]] && alive "$dir/slurmctld.mypid"; then
    # cancel whatever is still running so slurmd's step daemons end their tasks
    SLURM_CONF=$dir/slurm.conf scancel --full --quiet --partition=debug 2>/dev/null || true
    sleep 1
  fi
  stop_pidfile "$dir/slurmd.mypid"
  stop_pidfile "$dir/slurmctld.mypid"
  stop_pidfile "$dir/munged.mypid"
  # Step daemons (slurmstepd) and job tasks that survived: every process this cluster started
  # inherited SLURM_CONF=DIR/slurm.conf (exported before the daemons start), which no other
  # process on the machine has, so match on that exact environment entry.
  # This shell and its ancestors are spared (a caller may have exported the same SLURM_CONF).
  local f pid marker="SLURM_CONF=$dir/slurm.conf" spare=" " p=$BASHPID
  while [[ -n $p && $p != 0 ]]; do
    spare+="$p "
    p=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f2 || true)
  done
  for f in /proc/[0-9]*/environ; do
    pid=${f#/proc/}; pid=${pid%/environ}
    [[ $spare == *" $pid "* ]] && continue
    if tr '\0' '\n' 2>/dev/null <"$f" | grep -qxF -- "$marker"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$dir"
}

cmd_run() {
  need_root
  cmd_install
  RUN_DIR=$(mktemp -d /tmp/local_slurm.XXXXXX)  # global: the EXIT trap runs after we return
  trap 'cmd_down "$RUN_DIR"' EXIT
  trap 'exit 130' INT TERM
  (cmd_up "$RUN_DIR") >/dev/null
  SLURM_CONF=$RUN_DIR/slurm.conf sbatch --wait "$@"
}

case ${1:-} in
  install) cmd_install ;;
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  run) shift; cmd_run "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
