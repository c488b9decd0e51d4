#!/usr/bin/env bash
# Emulates M nodes x N ranks on one machine: one network namespace per node (tfc-node0..), all
# joined to the bridge tfc-br0 through veth pairs, with the inter-node link shaped by tbf.
#
#   scripts/emulate_cluster.sh up M N --inter-mbit X   # create (replaces an existing emulation)
#   scripts/emulate_cluster.sh reshape --inter-mbit X  # change the inter-node rate of a running one
#   scripts/emulate_cluster.sh down                    # remove everything we created (idempotent)
#   scripts/emulate_cluster.sh status                  # print the state file and the live objects
#
# Ranks inside one namespace talk over its loopback (unshaped); traffic between namespaces leaves
# through the namespace-side veth (tfc-nI, tbf at X Mbit/s) and enters the other namespace through
# the bridge-side veth (tfc-bI, tbf at X Mbit/s), so each direction is limited to X Mbit/s.
# Addresses come from 198.18.0.0/15 (benchmarking range): bridge .254, node I = 198.18.0.(I+1).
# tfc_apps.cluster_launch reads the state file to start Horovod ranks inside the namespaces.
# Horovod 0.28.1 creates the Gloo devices of its process sets without HOROVOD_GLOO_IFACE and binds
# them to whatever this machine's hostname resolves to (127.0.0.1 here), so each namespace gets an
# /etc/netns/tfc-nodeI/hosts (which `ip netns exec` mounts over /etc/hosts) mapping the hostname
# to the node's address.
set -eEuo pipefail

STATE=${TF_COMMLIB_CLUSTER_STATE:-/run/tf_commlib_cluster.env}
BR=tfc-br0
SUBNET=198.18.0
BR_ADDR=$SUBNET.254

die() { echo "emulate_cluster.sh: $*" >&2; exit 1; }
usage() { die "usage: $0 up M N --inter-mbit X | reshape --inter-mbit X | down | status"; }

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (namespaces, veths, qdiscs need CAP_NET_ADMIN): sudo $0 $cmd $*"
  command -v ip >/dev/null && command -v tc >/dev/null || die "ip/tc not found: run scripts/install_apt.sh (iproute2)"
}

down() {
  local ns dev
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^tfc-' || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true   # our ranks only
    ip netns del "$ns"
  done
  # Deleting the bridge-side veth removes its peer and qdiscs; the bridge goes last.
  for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^tfc-' || true); do
    ip link del "$dev" 2>/dev/null || true
  done
  rm -rf /etc/netns/tfc-node*
  rmdir /etc/netns 2>/dev/null || true
  rm -f "$STATE" "$STATE.tmp"
}

up() {
  [ $# -ge 2 ] || usage
  local m=$1 n=$2 mbit=""; shift 2
  while [ $# -gt 0 ]; do
    case $1 in
      --inter-mbit) mbit=${2:-}; shift 2 || usage ;;
      --inter-mbit=*) mbit=${1#*=}; shift ;;
      *) usage ;;
    esac
  done
  [[ $m =~ ^[0-9]+$ && $n =~ ^[0-9]+$ && $mbit =~ ^[0-9]+$ ]] || usage
  [ "$m" -ge 1 ] && [ "$m" -le 253 ] && [ "$n" -ge 1 ] && [ "$mbit" -ge 1 ] || die "need 1<=M<=253, N>=1, X>=1"
  local shape; shape=$(tbf "$mbit")
  down
  trap 'echo "emulate_cluster.sh: setup failed, cleaning up" >&2; down' ERR
  ip link add "$BR" type bridge
  ip addr add "$BR_ADDR/24" dev "$BR"
  ip link set "$BR" up
  {
    echo "# written by scripts/emulate_cluster.sh up $m $n --inter-mbit $mbit"
    echo "M=$m"; echo "N=$n"; echo "INTER_MBIT=$mbit"
    echo "BRIDGE=$BR"; echo "BRIDGE_ADDR=$BR_ADDR"
  } > "$STATE.tmp"
  local i ns addr
  for ((i = 0; i < m; i++)); do
    ns=tfc-node$i addr=$SUBNET.$((i + 1))
    ip netns add "$ns"
    ip link add "tfc-b$i" type veth peer name "tfc-n$i" netns "$ns"
    ip link set "tfc-b$i" master "$BR" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$addr/24" dev "tfc-n$i"
    ip -n "$ns" link set "tfc-n$i" up
    tc -n "$ns" qdisc add dev "tfc-n$i" root $shape
    mkdir -p "/etc/netns/$ns"
    printf '127.0.0.1 localhost\n%s %s %s\n' "$addr" "$(hostname)" "$ns" > "/etc/netns/$ns/hosts"
    tc qdisc add dev "tfc-b$i" root $shape
    echo "NODE${i}_NS=$ns"; echo "NODE${i}_IFACE=tfc-n$i"; echo "NODE${i}_ADDR=$addr"
  done >> "$STATE.tmp"
  mv "$STATE.tmp" "$STATE"
  trap - ERR
  echo "emulated cluster: $m nodes x $n ranks, inter-node $mbit Mbit/s each way; state in $STATE"
}

# tbf bucket: 4 ms worth of traffic, at least 64 KiB so that a GSO super-packet of a veth fits.
tbf() {
  local mbit=$1 burst=$(( $1 * 500 > 65536 ? $1 * 500 : 65536 ))
  echo "tbf rate ${mbit}mbit burst $burst latency 50ms"
}

reshape() {
  local mbit=""
  case ${1:-} in
    --inter-mbit) mbit=${2:-} ;;
    --inter-mbit=*) mbit=${1#*=} ;;
    *) usage ;;
  esac
  [[ $mbit =~ ^[0-9]+$ ]] && [ "$mbit" -ge 1 ] || die "need X>=1"
  [ -f "$STATE" ] || die "no emulated cluster (no $STATE): run up first"
  local m i
  m=$(sed -n 's/^M=//p' "$STATE")
  for ((i = 0; i < m; i++)); do
    tc -n "tfc-node$i" qdisc change dev "tfc-n$i" root $(tbf "$mbit")
    tc qdisc change dev "tfc-b$i" root $(tbf "$mbit")
  done
  sed -i "s/^INTER_MBIT=.*/INTER_MBIT=$mbit/" "$STATE"
  echo "emulated cluster: inter-node now $mbit Mbit/s each way"
}

status() {
  if [ -f "$STATE" ]; then cat "$STATE"; else echo "no emulated cluster (no $STATE)"; fi
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^tfc-' || true); do
    echo "$ns: $(ip -n "$ns" -br addr show | grep tfc- || true)"
    tc -n "$ns" qdisc show | grep tbf || true
  done
  ip -br link show master "$BR" 2>/dev/null || true
}

cmd=${1:-}; [ $# -gt 0 ] && shift
case $cmd in
  up) need_root "$@"; up "$@" ;;
  reshape) need_root "$@"; reshape "$@" ;;
  down) need_root; down; echo "emulated cluster removed" ;;
  status) status ;;
  *) usage ;;
esac
