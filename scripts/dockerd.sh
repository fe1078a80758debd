#!/usr/bin/env bash
# Start, stop or check a local Docker engine on a machine that ships only the docker CLI, and build the
# local base image (no registry is reachable). Recipe: ../shared/CONTAINERS.md.
#
#   scripts/dockerd.sh start        start dockerd if no engine answers (prints "started" or "running")
#   scripts/dockerd.sh stop         stop the dockerd this script started (by PID) and clean up
#   scripts/dockerd.sh status       exit 0 when an engine answers
#   scripts/dockerd.sh base-image   build local/debian:bookworm with debootstrap if it is missing
#   scripts/dockerd.sh install      apt-get install docker.io debootstrap (root; ~35 s)
#
# DOCKERD_DIR (default /tmp/docker) holds the data root, exec root, pid file and log. The base image is
# bootstrapped from the Debian mirror in this machine's own apt sources (or DEBIAN_MIRROR).
set -euo pipefail
D=${DOCKERD_DIR:-/tmp/docker}
BASE_IMAGE=${BASE_IMAGE:-local/debian:bookworm}

answers() { docker version >/dev/null 2>&1; }

start() {
  if answers; then echo running; return 0; fi
  command -v dockerd >/dev/null || { echo "dockerd is not installed: run '$0 install' (needs root)" >&2; exit 3; }
  mkdir -p "$D"
  # These options leave the host's firewall and forwarding untouched (no default bridge).
  setsid /usr/sbin/dockerd --iptables=false --ip6tables=false --ip-forward=false --bridge=none \
    --storage-driver=overlay2 --data-root "$D/data" --exec-root "$D/exec" --pidfile "$D/dockerd.pid" \
    -H unix:///var/run/docker.sock > "$D/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 1 120); do
    if answers; then echo started; return 0; fi
    sleep 0.5
  done
  echo "dockerd did not answer within 60 s; see $D/dockerd.log" >&2
  tail -5 "$D/dockerd.log" >&2 || true
  exit 1
}

stop() {
  [ -f "$D/dockerd.pid" ] || { echo "no dockerd started by this script ($D/dockerd.pid missing)"; return 0; }
  P=$(cat "$D/dockerd.pid")
  if kill -0 "$P" 2>/dev/null; then
    kill -TERM "$P"
    while kill -0 "$P" 2>/dev/null; do sleep 0.5; done
  fi
  umount "$D/exec/netns/default" 2>/dev/null || true
  for c in /sys/fs/cgroup/*/docker /sys/fs/cgroup/docker; do rmdir "$c/buildkit" "$c" 2>/dev/null || true; done
  rm -f "$D/dockerd.pid"
  echo stopped
}

# The Debian mirror this machine's apt already uses (deb822 .sources or a one-line sources.list entry);
# nothing here names a registry host.
debian_mirror() {
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{for (i = 2; i <= NF; i++) print $i}'
    grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}'
  } | grep -m1 -E '/debian/?$' || true
}

base_image() {
  if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then echo "$BASE_IMAGE present"; return 0; fi
  command -v debootstrap >/dev/null || { echo "debootstrap is not installed: run '$0 install'" >&2; exit 3; }
  mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
  [ -n "$mirror" ] || { echo "no Debian mirror found in /etc/apt/sources.list*: set DEBIAN_MIRROR" >&2; exit 3; }
  rm -rf "$D/rootfs"
  debootstrap --variant=minbase bookworm "$D/rootfs" "$mirror" > "$D/debootstrap.log" 2>&1 \
    || { echo "debootstrap failed; see $D/debootstrap.log" >&2; exit 1; }
  tar -C "$D/rootfs" -c . | docker import - "$BASE_IMAGE" >/dev/null
  rm -rf "$D/rootfs"
  echo "$BASE_IMAGE built"
}

install() {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io debootstrap >/dev/null
  echo installed
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) answers ;;
  base-image) base_image ;;
  install) install ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
