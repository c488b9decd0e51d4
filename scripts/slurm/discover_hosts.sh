#!/bin/sh
# horovodrun's --host-discovery-script inside a Slurm job: the job's nodes that Slurm holds as up, one
# "node:slots" a line. Slots: $TF_COMMLIB_SLOTS, else $SLURM_NTASKS_PER_NODE, else 1. A node that is
# down, drained or draining (as after a preemption notice), failing or not responding is left out, so
# horovodrun treats its ranks as lost; one that comes back is listed again.
set -eu
slots=${TF_COMMLIB_SLOTS:-${SLURM_NTASKS_PER_NODE:-1}}
sinfo -h -N -n "$SLURM_JOB_NODELIST" -o '%N %t' |
  awk -v slots="$slots" '$2 ~ /^(idle|alloc|mix|comp)$/ { print $1 ":" slots }' | sort -u
