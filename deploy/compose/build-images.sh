#!/usr/bin/env bash
# Builds the images of the compose cluster locally, pulling nothing:
#
#   berth/berth:dev  the berth binary (replicas and node agents) with the shared libraries it
#                    links, plus static busybox: /bin/sh and the tools the node agent's `local`
#                    backend runs, and the shell the node service's entrypoint uses
#   berth/etcd:dev   Debian's etcd and etcdctl (apt-get install etcd-server etcd-client) with
#                    their shared libraries, plus static busybox for the etcd-init step's shell
#
# Both are `FROM scratch` images assembled from host files (see Dockerfile in this folder):
# no registry is reached, `scratch` is not pulled. The binaries are dynamically linked, so
# the loader and every library `ldd` names are copied beside them; that keeps glibc's own
# DNS resolver, which a static glibc binary would lack (compose service names must resolve).
#
# Idempotent: each image carries a label with the SHA-256 of its inputs (binaries, libraries,
# this script, the Dockerfile); an image whose label matches is left alone.
#
# Usage: deploy/compose/build-images.sh
#   BERTH_BIN=path/to/berth   use this binary (default: builds target/release/berth with cargo)
#   ETCD_BIN=/usr/bin/etcd    etcd binary   BUSYBOX=/bin/busybox   static busybox
#   BERTH_IMAGE=berth/berth:dev  ETCD_IMAGE=berth/etcd:dev   image names
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
berth_image="${BERTH_IMAGE:-berth/berth:dev}"
etcd_image="${ETCD_IMAGE:-berth/etcd:dev}"
etcd_bin="${ETCD_BIN:-/usr/bin/etcd}"
etcdctl_bin="${ETCDCTL_BIN:-/usr/bin/etcdctl}"
busybox="${BUSYBOX:-/bin/busybox}"

log() { printf 'build-images: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v docker >/dev/null || die "docker CLI not found"
[ -x "$etcd_bin" ] || die "$etcd_bin not found (apt-get install etcd-server, or set ETCD_BIN=)"
[ -x "$etcdctl_bin" ] || die "$etcdctl_bin not found (apt-get install etcd-client, or set ETCDCTL_BIN=)"
[ -x "$busybox" ] || die "$busybox not found (apt-get install busybox-static, or set BUSYBOX=)"
if command -v file >/dev/null && ! file -L "$busybox" | grep -q 'statically linked'; then
    die "$busybox is not statically linked (install busybox-static)"
fi

if [ -n "${BERTH_BIN:-}" ]; then
    berth_bin="$BERTH_BIN"
else
    log "cargo build --release -p berth"
    (cd "$repo" && cargo build --release --locked -p berth >&2)
    berth_bin="$repo/target/release/berth"
fi
[ -x "$berth_bin" ] || die "$berth_bin is not an executable"

# The shared objects a binary needs, as absolute paths (the loader included).
libraries_of() {
    ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u
}

# Copies binary $1 to $2/usr/local/bin/ with its libraries at their host paths.
add_binary() {
    local binary="$1" rootfs="$2" library
    local target="$rootfs/usr/local/bin/$(basename "$binary")"
    install -D -m 0755 "$binary" "$target"
    # The release profile keeps debug info (100+ MB); the image needs none of it.
    if command -v strip >/dev/null; then strip --strip-debug "$target"; fi
    for library in $(libraries_of "$binary"); do
        install -D -m 0755 "$(readlink -f "$library")" "$rootfs$library"
    done
}

# A minimal /etc, /tmp and the directories the services write to.
add_base_files() {
    local rootfs="$1"
    mkdir -p "$rootfs"/{etc,tmp,var/lib/berth,var/lib/etcd,run/berth}
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
    printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
    chmod 1777 "$rootfs/tmp"
}

add_busybox() {
    local rootfs="$1" applet dir up
    install -D -m 0755 "$busybox" "$rootfs/bin/busybox"
    "$busybox" --list-full | while read -r applet; do
        case "$applet" in bin/busybox | linuxrc) continue ;; esac
        dir="$(dirname "$applet")"
        mkdir -p "$rootfs/$dir"
        up="$(printf '%s' "$dir" | sed -e 's#[^/][^/]*#..#g')"
        ln -sf "$up/bin/busybox" "$rootfs/$applet"
    done
}

# build IMAGE KIND FILES... : builds IMAGE from a staged rootfs unless its label matches.
build() {
    local image="$1" kind="$2"
    shift 2
    local digest existing workdir
    digest="$(cat "$@" "${BASH_SOURCE[0]}" "$here/Dockerfile" | sha256sum | cut -d' ' -f1)"
    existing="$(docker image inspect --format '{{ index .Config.Labels "berth.image.inputs" }}' "$image" 2>/dev/null || true)"
    if [ "$existing" = "$digest" ]; then
        log "$image is up to date"
        return
    fi
    workdir="$(mktemp -d)"
    # shellcheck disable=SC2064 # expand now: the trap must remove this build's directory
    trap "rm -rf '$workdir'" RETURN
    mkdir -p "$workdir/rootfs"
    add_base_files "$workdir/rootfs"
    case "$kind" in
        berth)
            add_binary "$berth_bin" "$workdir/rootfs"
            add_busybox "$workdir/rootfs"
            ;;
        etcd)
            add_binary "$etcd_bin" "$workdir/rootfs"
            add_binary "$etcdctl_bin" "$workdir/rootfs"
            add_busybox "$workdir/rootfs"
            ;;
    esac
    cp "$here/Dockerfile" "$workdir/Dockerfile"
    log "building $image"
    docker build --quiet --label "berth.image.inputs=$digest" -t "$image" "$workdir" >/dev/null
    log "built $image"
}

# shellcheck disable=SC2046 # the library list is one path per word
build "$berth_image" berth "$berth_bin" "$busybox" $(libraries_of "$berth_bin")
# shellcheck disable=SC2046
build "$etcd_image" etcd "$etcd_bin" "$etcdctl_bin" "$busybox" $(libraries_of "$etcd_bin") $(libraries_of "$etcdctl_bin")
