# sh -c SCRIPT berth-read REL: streams the regular file REL on stdout.
berth_fail() {
	printf 'berth-error %s\n' "$1" >&2
	exit 86
}
berth_resolve "$1" 0
p=$W/$R
[ -n "$R" ] || berth_fail isdir
[ ! -d "$p" ] || berth_fail isdir
[ -e "$p" ] || berth_fail notfound
[ -f "$p" ] || berth_fail notregular
exec cat -- "$p"
