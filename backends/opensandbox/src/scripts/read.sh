# set -- NONCE REL: streams the regular file REL, hex-encoded by od, after reporting
# "berth-NONCE ok" (or "berth-NONCE fail KIND") on stderr.
nonce=$1
berth_fail() {
	printf 'berth-%s fail %s\n' "$nonce" "$1" >&2
	exit 86
}
berth_resolve "$2" 0
p=$W/$R
[ -n "$R" ] || berth_fail isdir
[ ! -d "$p" ] || berth_fail isdir
[ -e "$p" ] || berth_fail notfound
[ -f "$p" ] || berth_fail notregular
exec 3<"$p" || berth_fail io
printf 'berth-%s ok\n' "$nonce" >&2
exec od -An -v -tx1 <&3
