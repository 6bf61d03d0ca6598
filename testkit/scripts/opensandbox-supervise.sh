#!/bin/sh
# Runs one opensandbox-server for the test processes of one test run, and cleans up after
# the last of them: supervise.sh DIR SERVER_BINARY CONFIG IMAGE
#
# DIR holds `lock` (flock: taken by every test process that joins, and here before
# deciding to stop), `pids` (the test processes that joined) and `state` (the server's
# port, written by the starting test). The server stops once no process in `pids` is alive
# and `pids` has not changed for 5 s; then every container made from IMAGE (an image of
# this server's own, so nothing else matches) is removed, the image too, and DIR.
dir=$1
server=$2
config=$3
image=$4
"$server" --config "$config" >"$dir/server.log" 2>&1 &
server_pid=$!
echo "$server_pid" >"$dir/server.pid"
while :; do
	sleep 2
	kill -0 "$server_pid" 2>/dev/null || break
	if flock "$dir/lock" sh -c '
		for pid in $(cat "$1/pids" 2>/dev/null); do
			kill -0 "$pid" 2>/dev/null && exit 1
		done
		[ $(( $(date +%s) - $(stat -c %Y "$1/pids") )) -ge 5 ] || exit 1
		rm -f "$1/state"
	' sh "$dir"; then
		break
	fi
done
kill "$server_pid" 2>/dev/null
wait "$server_pid" 2>/dev/null
left=$(docker ps -aq --filter "ancestor=$image")
if [ -n "$left" ]; then
	echo "removing containers the tests left: $left" >>"$dir/server.log"
	docker rm -f -v $left >/dev/null 2>&1
fi
docker image rm -f "$image" >/dev/null 2>&1
rm -rf -- "$dir"
