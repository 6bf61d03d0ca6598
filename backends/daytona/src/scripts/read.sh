# sh -c SCRIPT berth-read REL: checks that REL is a regular file inside the workspace and
# prints its resolved path below the root, base64 (names may hold any byte).
berth_fail() {
	printf 'berth-error %s\n' "$1"
	exit 86
}
berth_resolve "$1" 0
p=$W/$R
[ -n "$R" ] || berth_fail isdir
[ ! -d "$p" ] || berth_fail isdir
[ -e "$p" ] || berth_fail notfound
[ -f "$p" ] || berth_fail notregular
printf 'berth-ok '
printf '%s' "$R" | base64 | tr -d '\n'
printf '\n'
