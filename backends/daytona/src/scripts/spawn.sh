# sh -c SCRIPT berth-spawn NONCE GENERATION GENFILE DIR CWD ARGV...: the wrapper of every
# spawned process, run as an asynchronous command of a toolbox session of its own.
#
# Refuses when the sandbox was adopted by a newer generation, resolves CWD inside the
# workspace, checks that ARGV[0] can be found, then runs ARGV as a session leader
# (`setsid`, which does not fork here: a background job is no group leader) with its
# stdout and stderr in DIR/out and DIR/err — two files, so the streams stay apart and
# binary-safe — and its stdin from DIR/in, a FIFO a feeder fills from this command's own
# stdin: lines of base64 (the toolbox's input call carries text), a "." line for EOF.
# DIR/pid appears when ARGV runs, DIR/status (its wait status) when it ended, DIR/fail
# (a kind) when it could not start; `poll.sh` reads them.
nonce=$1
gen=$2
genfile=$3
dir=$4
cwd=$5
shift 5
mkdir -p -m 700 -- "$dir" || exit 125
berth_publish() {
	printf '%s\n' "$2" >"$dir/$1.tmp" && mv -f -- "$dir/$1.tmp" "$dir/$1"
}
berth_fail() {
	berth_publish fail "$1"
	exit 127
}
berth_fence "$gen" "$genfile"
berth_resolve "$cwd" 0
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
: >"$dir/out" && : >"$dir/err" && mkfifo -m 600 "$dir/in" || berth_fail io
# An asynchronous list's stdin is /dev/null unless redirected: keep ours on fd 3.
exec 3<&0
(
	while IFS= read -r line; do
		[ "$line" = . ] && break
		printf '%s' "$line" | base64 -d || break
	done >"$dir/in"
) <&3 &
feeder=$!
launcher=
command -v setsid >/dev/null 2>&1 && launcher=setsid
BERTH_EXEC_ID=$nonce $launcher "$@" <"$dir/in" >"$dir/out" 2>"$dir/err" 3<&- &
child=$!
berth_publish pid "$child"
wait "$child"
status=$?
kill "$feeder" 2>/dev/null
berth_publish status "$status"
