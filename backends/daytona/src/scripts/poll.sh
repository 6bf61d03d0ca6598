# sh -c SCRIPT berth-poll DIR OUT_OFFSET ERR_OFFSET MAX: the state of a spawned process and
# what it wrote since the offsets (at most MAX bytes per stream), on three lines: the state
# ("starting", "running PID", "exit STATUS", "fail KIND", "gone"), then base64 of new stdout,
# then base64 of new stderr. The state is read before the output, so output read after an
# "exit" is complete.
dir=$1
out=$2
err=$3
max=$4
state=gone
if [ -f "$dir/status" ]; then
	read -r status <"$dir/status"
	state="exit $status"
elif [ -f "$dir/fail" ]; then
	read -r kind <"$dir/fail"
	state="fail $kind"
elif [ -f "$dir/pid" ]; then
	read -r pid <"$dir/pid"
	state="running $pid"
elif [ -d "$dir" ]; then
	state=starting
fi
printf '%s\n' "$state"
if [ -f "$dir/out" ]; then tail -c +$((out + 1)) -- "$dir/out" | head -c "$max" | base64 | tr -d '\n'; fi
printf '\n'
if [ -f "$dir/err" ]; then tail -c +$((err + 1)) -- "$dir/err" | head -c "$max" | base64 | tr -d '\n'; fi
printf '\n'
