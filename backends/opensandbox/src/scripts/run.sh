# Common tail of spawn.sh and secret.sh: runs "$@" with stdin from $input (`null`, `fifo`:
# a FIFO in the run directory fed by later commands, or a staged file), stdout and stderr
# hex-encoded by od, chunk by chunk (the execd API carries output as JSON text, which is not binary-safe),
# reports "berth-NONCE ok" on stderr first, and exits with the program's status (128+n
# for a signal n, as shells report it).
run=$S/run-$(id -u)/$nonce
mkdir -m 0700 -- "$run" 2>/dev/null || berth_fail private
mkfifo -- "$run/o" "$run/e" || berth_fail private
# od buffers its output until it exits, so each chunk the pipe yields gets an od of its
# own: live output (an MCP server's answer, a streamed exec) is never held back.
# Past $limit bytes (when not -1) the rest is read and dropped unencoded: the caller caps
# each stream there anyway and only needs to see that more came.
berth_encode() {
	# Stopped with TERM (below), an encoder takes its dd along: nothing is left to be reaped
	# by an init that may not reap.
	trap 'kill "$chunk" 2>/dev/null; wait "$chunk" 2>/dev/null; exit 0' TERM
	sent=0
	while :; do
		if [ "$limit" -ge 0 ] && [ "$sent" -gt "$limit" ]; then
			exec cat <&4 >/dev/null
		fi
		# From fd 4: an asynchronous command's stdin is /dev/null before its redirections.
		dd of="$2" bs=65536 count=1 2>/dev/null <&4 &
		chunk=$!
		wait "$chunk"
		[ -s "$2" ] || break
		if [ "$limit" -ge 0 ]; then
			sent=$((sent + $(wc -c <"$2")))
		fi
		od -An -v -tx1 "$2"
	done 4<"$1"
}
berth_encode "$run/o" "$run/oc" &
odo=$!
berth_encode "$run/e" "$run/ec" >&2 &
ode=$!
holder=
case $input in
null) exec 3</dev/null ;;
fifo)
	mkfifo -- "$run/i" || berth_fail private
	# Keeps the FIFO open for writing between the feeding commands; killed at end of input.
	sleep 2147483647 >"$run/i" 2>/dev/null &
	holder=$!
	echo "$holder" >"$run/h"
	exec 3<"$run/i"
	;;
*) exec 3<"$input" || berth_fail stdin ;;
esac
printf 'berth-%s ok\n' "$nonce" >&2
"$@" <&3 >"$run/o" 2>"$run/e" 3<&- &
pid=$!
exec 3<&-
wait "$pid"
status=$?
# Output still in the pipes is read; an orphan holding a pipe gets a second, then its
# encoders are stopped so the exit is not held up. Helpers that may outlive this shell
# hold none of its output (the daemon would wait for them), and every helper is reaped
# here (the sandbox's init may not reap orphans).
(
	trap 'kill "$timer" 2>/dev/null; wait "$timer" 2>/dev/null; exit 0' TERM
	sleep 1 &
	timer=$!
	wait "$timer"
	kill "$odo" "$ode" 2>/dev/null
) </dev/null >/dev/null 2>&1 &
reaper=$!
wait "$odo" "$ode" 2>/dev/null
kill "$reaper" 2>/dev/null
wait "$reaper" 2>/dev/null
if [ -n "$holder" ]; then
	kill "$holder" 2>/dev/null
	wait "$holder" 2>/dev/null
fi
rm -rf -- "$run"
exit "$status"
