#!/usr/bin/env bash
# Installs the Debian packages the project needs, only those missing (fast when all are there).
set -euo pipefail
pkgs="redis-server iproute2 g++ make cmake python3-dev"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
[ "$(id -u)" = 0 ] && sudo="" || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends $missing
