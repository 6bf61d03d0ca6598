# set -- NONCE REL MODE SRC: atomically replaces REL with the staged file SRC: a temp file
# beside the target, then a rename over it. Creates missing parents, removed again when
# the write fails. Fails with "berth-error KIND" as its last stderr line and exit 86.
nonce=$1
rel=$2
mode=$3
src=$4
tmp=
berth_fail() {
	[ -z "$tmp" ] || rm -f -- "$tmp"
	rm -f -- "$src"
	berth_rollback
	printf 'berth-error %s\n' "$1" >&2
	exit 86
}
berth_resolve "$rel" 1
[ -n "$R" ] || berth_fail isdir
p=$W/$R
[ ! -d "$p" ] || berth_fail isdir
# An existing file keeps its permission bits, as on the host backends.
if [ -f "$p" ]; then
	mode=$(stat -c %a -- "$p") || berth_fail io
fi
case $R in
*/*) dir=$W/${R%/*} ;;
*) dir=$W ;;
esac
set -C
tmp=$dir/.berth-tmp-$nonce
umask 077
mv -f -T -- "$src" "$tmp" 2>/dev/null || cat -- "$src" >"$tmp" || berth_fail io
set +C
rm -f -- "$src"
chmod "$mode" -- "$tmp" || berth_fail io
mv -f -T -- "$tmp" "$p" || berth_fail io
