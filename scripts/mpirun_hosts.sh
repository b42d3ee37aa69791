#!/usr/bin/env bash
# mpirun_hosts.sh: mpirun across hosts, with the settings that make a dead
# link end the whole job.
#
#   scripts/mpirun_hosts.sh -np 8 --hostfile hosts build/03_zero3/zero3 --model small --comm-timeout 60
#
# Every argument goes to mpirun as given; in front of them this adds
# OpenMPI's out-of-band keepalive, from the stage's --comm-timeout T (else
# ZF_COMM_TIMEOUT_S, else 600 s):
#
#   --mca oob_tcp_keepalive_time T/4 --mca oob_tcp_keepalive_intvl T/20 --mca oob_tcp_keepalive_probes 5
#
# (each at least 1 s). Why: mpirun and the daemon it starts on each other
# host (orted) talk over TCP, the out-of-band channel. When the link
# between two hosts dies, the ranks notice within T (a collective times
# out, docs/RELIABILITY.md) and end the job with MPI_Abort, which the
# daemons must pass on over the dead link: data that TCP cannot deliver is
# given up only after its retransmissions, about 15 minutes, and until then
# mpirun, and the other host's daemon, stay. The keepalive probes the
# daemons' connection while it is idle, and declares it dead after at most
# T/4 + 5 T/20 = T/2 (T of 8 s or more), before the ranks time out and
# anything waits unsent on it: mpirun kills its host's ranks and exits,
# the other host's daemon kills its ranks and exits. Five probes, not
# fewer, so that a lossy link is not taken for a dead one; on a link that
# loses more than a few percent of its packets raise --comm-timeout.
#
# Under Slurm, srun needs none of this: slurmd on each node watches its
# own tasks, and --kill-on-bad-exit=1 ends every task of the step when one
# exits non-zero (the rank that timed out), on every node.
set -euo pipefail

timeout_s="${ZF_COMM_TIMEOUT_S:-600}"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --comm-timeout) timeout_s="${args[i + 1]:-}" ;;
    --comm-timeout=*) timeout_s="${args[i]#--comm-timeout=}" ;;
  esac
done
if ! [[ "$timeout_s" =~ ^[0-9]+([.][0-9]+)?$ ]] || [[ "$timeout_s" =~ ^0+([.]0+)?$ ]]; then
  echo "mpirun_hosts.sh: --comm-timeout (or ZF_COMM_TIMEOUT_S) is '$timeout_s': give a number of seconds above 0" >&2
  exit 2
fi
t=${timeout_s%.*}
keepalive_time=$(( t / 4 > 1 ? t / 4 : 1 ))
keepalive_intvl=$(( t / 20 > 1 ? t / 20 : 1 ))

exec mpirun --mca oob_tcp_keepalive_time "$keepalive_time" --mca oob_tcp_keepalive_intvl "$keepalive_intvl" \
  --mca oob_tcp_keepalive_probes 5 "$@"
