#!/usr/bin/env bash
# Builds the execd image an OpenSandbox server needs (`[runtime] execd_image`), holding the
# execd stand-in instead of the real daemon, without pulling anything.
#
# The server reads /execd and /bootstrap.sh out of this image (from a helper container that
# runs `tail -f /dev/null`, hence busybox) and copies them into every sandbox. The image is
# assembled from the stand-in binary (built static by the tests), bootstrap.sh beside this
# script and the host's busybox-static, then imported with `docker import`.
#
# Idempotent: the image carries a label with the SHA-256 of its inputs; when an image with
# that label exists it is left alone. Prints the image reference on stdout.
#
# Usage: build-image.sh STANDIN_BINARY [IMAGE]   (default image: berth/opensandbox-execd-standin:<digest>)
# Needs: docker, a statically linked busybox (Debian: busybox-static) at $BUSYBOX or /bin/busybox.
set -euo pipefail

binary="${1:?usage: build-image.sh STANDIN_BINARY [IMAGE]}"
busybox="${BUSYBOX:-/bin/busybox}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf 'build-image: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v docker >/dev/null || die "docker CLI not found"
[ -x "$busybox" ] || die "$busybox not found (apt-get install busybox-static, or set BUSYBOX=)"
[ -x "$binary" ] || die "$binary is not an executable"

digest="$(cat "$binary" "$here/bootstrap.sh" "$busybox" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
image="${2:-berth/opensandbox-execd-standin:$digest}"

existing="$(docker image inspect --format '{{ index .Config.Labels "berth.standin.inputs" }}' "$image" 2>/dev/null || true)"
if [ "$existing" = "$digest" ]; then
    printf '%s\n' "$image"
    exit 0
fi

workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT
rootfs="$workdir/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/tmp"
install -m 0755 "$busybox" "$rootfs/bin/busybox"
for applet in sh tail sleep; do
    ln -s busybox "$rootfs/bin/$applet"
done
install -m 0755 "$binary" "$rootfs/execd"
install -m 0755 "$here/bootstrap.sh" "$rootfs/bootstrap.sh"
chmod 1777 "$rootfs/tmp"
tar --sort=name --numeric-owner --owner=0 --group=0 --mtime='@0' -C "$rootfs" -cf "$workdir/rootfs.tar" .
log "importing $image"
docker import \
    --change 'ENV PATH=/bin' \
    --change "LABEL berth.standin.inputs=$digest" \
    --message "berth: OpenSandbox execd stand-in (test support)" \
    "$workdir/rootfs.tar" "$image" >/dev/null
printf '%s\n' "$image"
