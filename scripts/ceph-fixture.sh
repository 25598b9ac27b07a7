#!/usr/bin/env bash
# A throwaway single-node Ceph cluster for the RBD tests and benchmarks:
# one monitor, one manager and one BlueStore OSD on a sparse file, all in
# DIR, listening on 127.0.0.1 only, with an initialised `rbd` pool of size 1
# and a cephx user `client.openarray`.
#
#   ceph-fixture.sh start DIR   bring it up; prints the ceph.conf to use
#   ceph-fixture.sh stop DIR    stop every daemon and remove DIR
#   ceph-fixture.sh env DIR     print shell exports for a running cluster
#
# Runs as root without systemd: the daemons are started directly with
# -c CONF --cluster ceph -i ID. Installs the Ceph packages idempotently (apt
# runs only when something is missing). CEPH_FIXTURE_PORT picks the
# monitor's port (default 3300), CEPH_FIXTURE_OSD_SIZE the sparse OSD file
# (default 20G).
set -Eeuo pipefail

usage() {
  echo "usage: $0 start|stop|env DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
action=$1
DIR=$2
PORT=${CEPH_FIXTURE_PORT:-3300}
OSD_SIZE=${CEPH_FIXTURE_OSD_SIZE:-20G}
CONF="$DIR/ceph.conf"
POOL=rbd
CLIENT=client.openarray

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

install_packages() {
  # tool -> package that provides it
  declare -A need=(
    [ceph-mon]=ceph-mon
    [ceph-mgr]=ceph-mgr
    [ceph-osd]=ceph-osd
    [ceph]=ceph-common
    [rbd]=ceph-common
    [monmaptool]=ceph-base
    [ceph-authtool]=ceph-common
    [uuidgen]=uuid-runtime
  )
  local missing=() tool
  for tool in "${!need[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("${need[$tool]}")
  done
  # The crate links librbd and generates its bindings with libclang.
  [ -e /usr/include/rbd/librbd.h ] || missing+=(librbd-dev librados-dev)
  compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || missing+=(libclang-dev)
  if [ ${#missing[@]} -gt 0 ]; then
    mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
    echo "installing: ${pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >&2
    $SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2
  fi
}

write_conf() {
  local fsid=$1
  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$PORT
mon initial members = a
public network = 127.0.0.1/32
cluster network = 127.0.0.1/32
ms bind ipv4 = true
ms bind ipv6 = false
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
run dir = $DIR/run
admin socket = $DIR/run/\$cluster-\$name.asok
pid file = $DIR/run/\$cluster-\$name.pid
log file = $DIR/log/\$cluster-\$name.log
crash dir = $DIR/crash
# One OSD on one host: every copy count and failure domain is one.
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 2
mon data avail crit = 1
# A shared CI machine, not a data centre.
osd memory target = 939524096
bluestore cache autotune = true
osd op num shards = 1
osd op num threads per shard = 2
mon osd full ratio = 0.97
mon osd nearfull ratio = 0.95
mon osd backfillfull ratio = 0.96

[mon]
mon data = $DIR/\$cluster-\$id/mon
keyring = $DIR/\$cluster-\$id/mon/keyring

[mgr]
mgr data = $DIR/\$cluster-\$name
keyring = $DIR/\$cluster-\$name/keyring
mgr initial modules =

[osd]
osd data = $DIR/\$cluster-\$name
keyring = $DIR/\$cluster-\$name/keyring
osd objectstore = bluestore
bluestore block path = $DIR/\$cluster-\$name/block.img
bluestore block create = true
bluestore block size = $(numfmt --from=iec "$OSD_SIZE")
bluestore fsck on mount = false
osd crush update on start = true

[client]
keyring = $DIR/\$cluster.\$name.keyring
EOF
}

wait_for() {
  # wait_for SECONDS WHAT COMMAND...: retries COMMAND until it succeeds.
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "ceph-fixture: timed out after ${limit}s waiting for $what (logs in $DIR/log)" >&2
      return 1
    fi
    sleep 0.5
  done
}

ceph_cmd() { ceph -c "$CONF" --connect-timeout 10 "$@"; }

pgs_active() { ceph_cmd pg stat | grep -Eq '^[0-9]+ pgs: [0-9]+ active\+clean;'; }
osd_up() { ceph_cmd osd stat | grep -q '1 up'; }

start() {
  install_packages
  if [ -e "$DIR/ready" ] && ceph_cmd -s >/dev/null 2>&1; then
    echo "ceph-fixture: a cluster is already running in $DIR" >&2
    echo "$CONF"
    return 0
  fi
  stop_daemons
  rm -rf "$DIR"
  trap 'echo "ceph-fixture: start failed; logs in $DIR/log" >&2; stop_daemons' ERR
  mkdir -p "$DIR"/{run,log,crash,ceph-a/mon,ceph-mgr.x,ceph-osd.0}
  DIR=$(cd "$DIR" && pwd)
  CONF="$DIR/ceph.conf"
  local fsid
  fsid=$(uuidgen)
  write_conf "$fsid"

  # Keys: the monitors' own, and the administrator's, known to the monitor.
  ceph-authtool --create-keyring "$DIR/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$DIR/ceph.client.admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$DIR/mon.keyring" --import-keyring "$DIR/ceph.client.admin.keyring" >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$PORT]" "$DIR/monmap" >/dev/null

  ceph-mon -c "$CONF" --cluster ceph -i a --mkfs --monmap "$DIR/monmap" --keyring "$DIR/mon.keyring"
  ceph-mon -c "$CONF" --cluster ceph -i a
  wait_for 30 "the monitor" ceph_cmd mon stat

  ceph_cmd auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
    -o "$DIR/ceph-mgr.x/keyring" >/dev/null
  ceph-mgr -c "$CONF" --cluster ceph -i x

  local uuid
  uuid=$(uuidgen)
  ceph_cmd osd new "$uuid" >/dev/null
  # The key exists before mkfs, which already talks to the monitor.
  ceph-authtool --create-keyring "$DIR/ceph-osd.0/keyring" --gen-key -n osd.0 >/dev/null
  ceph_cmd auth add osd.0 osd 'allow *' mon 'allow profile osd' mgr 'allow profile osd' \
    -i "$DIR/ceph-osd.0/keyring" 2>>"$DIR/log/setup.log"
  ceph-osd -c "$CONF" --cluster ceph -i 0 --mkfs --osd-uuid "$uuid" 2>>"$DIR/log/setup.log"
  ceph-osd -c "$CONF" --cluster ceph -i 0 2>>"$DIR/log/setup.log"
  wait_for 60 "the OSD to come up" osd_up

  ceph_cmd osd pool create "$POOL" 8 8 >/dev/null 2>&1
  ceph_cmd osd pool set "$POOL" size 1 --yes-i-really-mean-it >/dev/null 2>&1
  wait_for 60 "the placement groups" pgs_active
  rbd -c "$CONF" pool init "$POOL"
  ceph_cmd auth get-or-create "$CLIENT" mon 'profile rbd' osd "profile rbd pool=$POOL" \
    mgr "profile rbd pool=$POOL" -o "$DIR/ceph.$CLIENT.keyring" >/dev/null
  echo "$CONF"
}

stop_daemons() {
  [ -d "$DIR/run" ] || return 0
  local pidfile pid deadline
  for pidfile in "$DIR"/run/*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
  done
  deadline=$((SECONDS + 15))
  for pidfile in "$DIR"/run/*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    while kill -0 "$pid" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then
        kill -9 "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.2
    done
  done
}

stop() {
  stop_daemons
  rm -rf "$DIR"
}

print_env() {
  [ -e "$CONF" ] || {
    echo "ceph-fixture: no cluster in $DIR" >&2
    exit 1
  }
  DIR=$(cd "$DIR" && pwd)
  echo "export CEPH_CONF=$DIR/ceph.conf"
  echo "export OPENARRAY_CEPH_CONF=$DIR/ceph.conf"
  echo "export OPENARRAY_CEPH_CLIENT=$CLIENT"
  echo "export OPENARRAY_CEPH_KEYRING=$DIR/ceph.$CLIENT.keyring"
  echo "export OPENARRAY_CEPH_POOL=$POOL"
}

case "$action" in
  start) start ;;
  stop) stop ;;
  env) print_env ;;
  *) usage ;;
esac
