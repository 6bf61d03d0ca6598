# Wrapper of every spawned process: sh -c SCRIPT berth-spawn NONCE CWD ARGV...
# Resolves CWD inside the workspace, checks that ARGV[0] can be found, reports
# "NONCE ok PID" (or "NONCE fail KIND") as the first line on stderr, then execs ARGV. The
# process keeps the PID, which runc made a session leader: that session is what kill()
# sweeps.
nonce=$1
dir=$2
shift 2
berth_fail() {
	printf '%s fail %s\n' "$nonce" "$1" >&2
	exit 127
}
berth_resolve "$dir" 0
if [ ! -d "$W/$R" ]; then
	[ ! -e "$W/$R" ] || berth_fail notdir
	berth_fail notfound
fi
cd -- "$W/$R" || berth_fail notfound
case $1 in
*/*)
	[ -f "$1" ] && [ -x "$1" ] || berth_fail noprogram
	;;
*)
	found=
	set -f
	IFS=:
	for entry in $PATH; do
		if [ -f "${entry:-.}/$1" ] && [ -x "${entry:-.}/$1" ]; then
			found=1
			break
		fi
	done
	unset IFS
	set +f
	[ -n "$found" ] || berth_fail noprogram
	;;
esac
printf '%s ok %s\n' "$nonce" "$$" >&2
exec "$@"
