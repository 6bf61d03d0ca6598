# sh -c SCRIPT berth-write REL MODE NONCE: atomically replaces REL with stdin.
#
# stdin is the content followed by a 63-byte trailer "berth-end-NONCE-SIZE" (SIZE zero
# padded to 20 digits). Only a complete stream with the right trailer is published: when
# the caller gives up (limit exceeded, failing source, dropped future) it closes stdin
# without a trailer and this script removes the temp file and the directories it created.
rel=$1
mode=$2
nonce=$3
tmp=
berth_fail() {
	[ -z "$tmp" ] || rm -f -- "$tmp"
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
# noclobber: the temp file is created, never opened through something already there.
set -C
tmp=$dir/.berth-tmp-$nonce
umask 077
cat >"$tmp" || berth_fail io
set +C
size=$(stat -c %s -- "$tmp") || berth_fail io
[ "$size" -ge 63 ] || berth_fail aborted
trailer=$(tail -c 63 -- "$tmp") || berth_fail io
case $trailer in
"berth-end-$nonce-"*) ;;
*) berth_fail aborted ;;
esac
declared=${trailer##*-}
while :; do
	case $declared in
	0?*) declared=${declared#0} ;;
	*) break ;;
	esac
done
[ "$((size - 63))" = "$declared" ] || berth_fail aborted
truncate -s "$declared" -- "$tmp" || berth_fail io
chmod "$mode" -- "$tmp" || berth_fail io
sync -d -- "$tmp" 2>/dev/null
mv -f -T -- "$tmp" "$p" || berth_fail io
