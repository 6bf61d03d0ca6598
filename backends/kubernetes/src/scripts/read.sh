# set -- NONCE REL: streams the regular file REL (resolved inside the workspace) to stdout,
# after "berth-NONCE ok" (or "berth-NONCE fail KIND", exit 86) on stderr.
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
exec cat <&3
