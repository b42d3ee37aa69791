#!/usr/bin/env bash
# mpirun_hosts.sh: mpirun across hosts, with the settings that make a dead
# link end the whole job.
#
#   scripts/mpirun_hosts.sh -np 8 --hostfile hosts build/03_zero3/zero3 --model small --comm-timeout 60
#
# Every argument goes to mpirun as given; in front of them this adds
# OpenMPI's out-of-band keepalive, from the stage's --comm-timeout T (else
# a ZF_COMM_TIMEOUT_S that mpirun passes on, -x ZF_COMM_TIMEOUT_S=T, else
# ZF_COMM_TIMEOUT_S here, which it then passes on to every host's ranks
# with -x, else 600 s):
#
#   --mca oob_tcp_keepalive_time T/4 --mca oob_tcp_keepalive_intvl T/20 --mca oob_tcp_keepalive_probes 5
#
# (each at least 1 s; none of them if the arguments set any oob_tcp_keepalive
# parameter: OpenMPI refuses a parameter given twice). Why: mpirun and the
# daemon it starts on each other host (orted) talk over TCP, the out-of-band
# channel. When the link between two hosts dies, the ranks notice within T
# (a collective times out, docs/RELIABILITY.md) and end the job with
# MPI_Abort, which the daemons must pass on over the dead link: data that
# TCP cannot deliver is given up only after its retransmissions, about 15
# minutes, and until then mpirun, and the other host's daemon, stay. The
# keepalive probes the daemons' connection while it is idle and declares it
# dead after at most T/4 + 5 max(1, T/20) seconds (T/2 from T = 20 s on,
# under T from 7 s on), before the ranks time out and anything waits unsent
# on it: mpirun kills its host's ranks and exits, the other host's daemon
# kills its ranks and exits. Five probes, not fewer, so that a lossy link is
# not taken for a dead one; on a link that loses more than a few percent of
# its packets raise --comm-timeout.
#
# Under Slurm there is no daemon of mpirun's to keep alive: slurmd on each
# node starts and watches that node's tasks. When the link dies, the ranks
# on both sides stop by themselves within T (their next collective crosses
# it and times out) and exit non-zero; with --kill-on-bad-exit=1, srun then
# kills the step's other tasks on every node it can still reach. What srun
# cannot know at once is that the far node's tasks are gone: it learns it
# when that node reports again, or when Slurm declares the node down
# (slurm.conf's SlurmdTimeout, set by the site); that wait holds srun, not
# a rank. Not tried here: no Slurm on the test machine.
set -euo pipefail

timeout_s=""
exported=0  # ZF_COMM_TIMEOUT_S already passed on with -x
user_keepalive=0
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  a=${args[i]}
  next=${args[i + 1]:-}
  case "$a" in
    --comm-timeout) timeout_s=$next ;;
    --comm-timeout=*) timeout_s=${a#--comm-timeout=} ;;
    -x) case "$next" in
          ZF_COMM_TIMEOUT_S=*) exported=1; [[ -z $timeout_s ]] && timeout_s=${next#ZF_COMM_TIMEOUT_S=} ;;
          ZF_COMM_TIMEOUT_S) exported=1 ;;
        esac ;;
    oob_tcp_keepalive_*) user_keepalive=1 ;;
  esac
done
extra=()
if [[ -z $timeout_s && -n ${ZF_COMM_TIMEOUT_S:-} ]]; then
  timeout_s=$ZF_COMM_TIMEOUT_S
  [[ $exported == 0 ]] && extra+=(-x ZF_COMM_TIMEOUT_S)  # the same timeout on every host's ranks
fi
timeout_s=${timeout_s:-600}
# As the stages read it (strtod): a number above 0 and at most 1e7, in any notation.
t=$(awk -v v="$timeout_s" 'BEGIN { if (v ~ /^[+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?$/ && v + 0 > 0 && v + 0 <= 1e7) printf "%d", v + 0; else print "bad" }')
if [[ $t == bad ]]; then
  echo "mpirun_hosts.sh: the communicator timeout is '$timeout_s' (--comm-timeout or ZF_COMM_TIMEOUT_S):" \
       "give a number of seconds above 0 and at most 1e7" >&2
  exit 2
fi
if [[ $user_keepalive == 0 ]]; then
  keepalive_time=$(( t / 4 > 1 ? t / 4 : 1 ))
  keepalive_intvl=$(( t / 20 > 1 ? t / 20 : 1 ))
  if (( keepalive_time + 5 * keepalive_intvl >= t )); then
    echo "mpirun_hosts.sh: note: with a timeout of $timeout_s s the keepalive (${keepalive_time} s + 5 x" \
         "${keepalive_intvl} s) cannot find a dead link before the ranks time out: a link that dies may leave" \
         "mpirun waiting; give --comm-timeout 7 or more" >&2
  fi
  extra+=(--mca oob_tcp_keepalive_time "$keepalive_time" --mca oob_tcp_keepalive_intvl "$keepalive_intvl"
          --mca oob_tcp_keepalive_probes 5)
fi
exec mpirun "${extra[@]}" "$@"
