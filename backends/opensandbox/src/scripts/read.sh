# set -- NONCE REL STAGED: reads the regular file REL as the agent user. With STAGED "-",
# streams it hex-encoded by od; else hard-links it (a copy when it is not the caller's own
# file, or on another filesystem) at STAGED, a fresh path in the caller's run directory, for
# the gateway to move into the staging directory and download. (Not `link`: resolve.sh
# uses that name.) Reports "berth-NONCE ok" (or
# "berth-NONCE fail KIND", exit 86) on stderr first.
nonce=$1
staged=$3
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
if [ "$staged" != - ]; then
	if [ -O "$p" ]; then
		ln -- "$p" "$staged" 2>/dev/null || cp -- "$p" "$staged" || berth_fail io
	else
		cp -- "$p" "$staged" || berth_fail io
	fi
	printf 'berth-%s ok\n' "$nonce" >&2
	exit 0
fi
exec 3<"$p" || berth_fail io
printf 'berth-%s ok\n' "$nonce" >&2
exec od -An -v -tx1 <&3
