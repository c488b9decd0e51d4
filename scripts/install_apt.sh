#!/usr/bin/env bash
# Installs the Debian packages the project needs, only those missing (fast when all are there).
# Slurm (slurmctld slurmd slurm-client munge libpmix2) is for tests/test_slurm.py, which starts a
# single-node Slurm of its own; no daemon is started here.
set -euo pipefail
pkgs="redis-server iproute2 g++ make cmake python3-dev libisal-dev slurmctld slurmd slurm-client munge libpmix2"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ "$(id -u)" = 0 ] && sudo="" || sudo="sudo"
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends $missing
fi
# Debian's slurmd loads libpmix.so, which only the -dev package links; point it at the library.
for pmix in /usr/lib/*/pmix2/lib; do
  if [ -e "$pmix/libpmix.so.2" ] && [ ! -e "$pmix/libpmix.so" ]; then
    $sudo ln -sf libpmix.so.2 "$pmix/libpmix.so"
  fi
done
