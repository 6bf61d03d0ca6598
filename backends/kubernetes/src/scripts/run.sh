# Common tail of spawn.sh and secret.sh: runs "$@" with the exec's stdin, its stdout and
# stderr through FIFOs copied by `cat` (so a background process that keeps them open holds
# a FIFO, not the exec: its stream ends a second after the program), reports
# "berth-NONCE ok" on stderr first, and exits with the program's status (128+n for a
# signal n, as shells report it). The program leads a session of its own and carries
# BERTH_EXEC_ID=NONCE, which is what kill.sh sweeps; its pid is in the run directory.
run=$S/run/$nonce
mkdir -p -m 0700 -- "$S/run" 2>/dev/null
mkdir -m 0700 -- "$run" || berth_fail private
mkfifo -- "$run/o" "$run/e" || berth_fail private
cat <"$run/o" &
co=$!
cat <"$run/e" >&2 &
ce=$!
exec 3<&0
printf 'berth-%s ok\n' "$nonce" >&2
if command -v setsid >/dev/null 2>&1; then
	BERTH_EXEC_ID=$nonce setsid "$@" <&3 >"$run/o" 2>"$run/e" 3<&- &
else
	BERTH_EXEC_ID=$nonce "$@" <&3 >"$run/o" 2>"$run/e" 3<&- &
fi
pid=$!
exec 3<&- </dev/null
echo "$pid" >"$run/pid"
wait "$pid"
status=$?
(
	trap 'kill "$timer" 2>/dev/null; wait "$timer" 2>/dev/null; exit 0' TERM
	sleep 1 &
	timer=$!
	wait "$timer"
	kill "$co" "$ce" 2>/dev/null
) </dev/null >/dev/null 2>&1 &
reaper=$!
wait "$co" "$ce" 2>/dev/null
kill "$reaper" 2>/dev/null
wait "$reaper" 2>/dev/null
rm -rf -- "$run"
exit "$status"
