#!/usr/bin/env bash
# Builds berth/base: the default image of Docker workspaces, without pulling anything.
#
# The image is a static busybox with its applet symlinks, /etc/passwd and /etc/group with
# root and an unprivileged `berth` user (uid/gid 1000), /tmp (1777), /home/berth and
# /workspace (the mount point of the workspace's host directory). It is assembled from the
# host's busybox-static binary and imported with `docker import`, so it needs no registry.
#
# Idempotent: the image carries a label with the SHA-256 of its inputs (busybox binary and
# this script); when an image with that label already exists it is left alone. Prints the
# image id on stdout (progress goes to stderr).
#
# Usage: deploy/images/build-base.sh [IMAGE]     (default: $BERTH_BASE_IMAGE or berth/base:latest)
#        BUSYBOX=/path/to/static/busybox deploy/images/build-base.sh
# Needs: docker, a statically linked busybox (Debian: apt-get install busybox-static).
set -euo pipefail

image="${1:-${BERTH_BASE_IMAGE:-berth/base:latest}}"
busybox="${BUSYBOX:-/bin/busybox}"
berth_uid=1000
berth_gid=1000

log() { printf 'build-base: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v docker >/dev/null || die "docker CLI not found"
[ -x "$busybox" ] || die "$busybox not found (apt-get install busybox-static, or set BUSYBOX=)"
# A dynamically linked busybox would need the host's libc inside the image.
if command -v file >/dev/null && ! file -L "$busybox" | grep -q 'statically linked'; then
    die "$busybox is not statically linked (install busybox-static)"
fi

script_path="$(readlink -f "${BASH_SOURCE[0]}")"
inputs_digest="$(cat "$busybox" "$script_path" | sha256sum | cut -d' ' -f1)"

existing="$(docker image inspect --format '{{ index .Config.Labels "berth.base.inputs" }}' "$image" 2>/dev/null || true)"
if [ "$existing" = "$inputs_digest" ]; then
    log "$image is up to date"
    docker image inspect --format '{{ .Id }}' "$image"
    exit 0
fi

workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT
rootfs="$workdir/rootfs"
mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,workspace,home/berth,proc,sys,dev,run,var/tmp}

install -m 0755 "$busybox" "$rootfs/bin/busybox"
# Relative links (bin/ls -> busybox, usr/bin/env -> ../../bin/busybox) so the tree is correct
# wherever it is unpacked; --list-full gives each applet's conventional directory.
"$busybox" --list-full | while read -r applet; do
    case "$applet" in bin/busybox | linuxrc) continue ;; esac
    dir="$(dirname "$applet")"
    mkdir -p "$rootfs/$dir"
    up="$(printf '%s' "$dir" | sed -e 's#[^/][^/]*#..#g')"
    ln -sf "$up/bin/busybox" "$rootfs/$applet"
done

cat >"$rootfs/etc/passwd" <<EOF
root:x:0:0:root:/root:/bin/sh
berth:x:${berth_uid}:${berth_gid}:berth workspace user:/home/berth:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$rootfs/etc/group" <<EOF
root:x:0:
berth:x:${berth_gid}:
nogroup:x:65534:
EOF
mkdir -p "$rootfs/root"
chmod 0700 "$rootfs/root"
chmod 1777 "$rootfs/tmp" "$rootfs/var/tmp"
chmod 0755 "$rootfs/workspace"

# Deterministic archive: sorted, numeric owners, fixed mtimes. Everything is root-owned
# except the berth user's home.
tar --sort=name --numeric-owner --owner=0 --group=0 --mtime='@0' \
    -C "$rootfs" --exclude=./home/berth -cf "$workdir/rootfs.tar" .
tar --numeric-owner --owner="$berth_uid" --group="$berth_gid" --mtime='@0' \
    -C "$rootfs" -rf "$workdir/rootfs.tar" ./home/berth

log "importing $image"
id="$(docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'WORKDIR /workspace' \
    --change 'CMD ["/bin/sh"]' \
    --change "LABEL berth.base.inputs=$inputs_digest" \
    --message "berth base image (busybox)" \
    "$workdir/rootfs.tar" "$image")"
log "built $image"
printf '%s\n' "$id"
