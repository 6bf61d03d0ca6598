# Common tail of spawn.sh and secret.sh: runs "$@" with stdin from $input (`null`, `fifo`:
# a FIFO in the run directory fed by later commands, or a staged file), stdout and stderr
# hex-encoded by od (the execd API carries output as JSON text, which is not binary-safe),
# reports "berth-NONCE ok" on stderr first, and exits with the program's status (128+n
# for a signal n, as shells report it).
run=$S/run-$(id -u)/$nonce
mkdir -m 0700 -- "$run" 2>/dev/null || berth_fail private
mkfifo -- "$run/o" "$run/e" || berth_fail private
od -An -v -tx1 <"$run/o" &
odo=$!
od -An -v -tx1 <"$run/e" >&2 &
ode=$!
holder=
case $input in
null) exec 3</dev/null ;;
fifo)
	mkfifo -- "$run/i" || berth_fail private
	# Keeps the FIFO open for writing between the feeding commands; killed at end of input.
	sleep 2147483647 >"$run/i" &
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
# Output still in the pipes is read; an orphan holding a pipe gets a second, then its od
# readers are stopped so the exit is not held up.
(
	sleep 1
	kill "$odo" "$ode" 2>/dev/null
) &
reaper=$!
wait "$odo" "$ode" 2>/dev/null
kill "$reaper" $holder 2>/dev/null
rm -rf -- "$run"
exit "$status"
