#!/bin/sh
# Entrypoint of OpenSandbox sandboxes that use the execd stand-in's image. The server copies
# this file and the daemon into the sandbox as /opt/opensandbox/bootstrap.sh and
# /opt/opensandbox/execd and starts the sandbox as `bootstrap.sh ENTRYPOINT...`. As the real
# bootstrap does without EXECD_INIT ("background and wait"): the daemon and the entrypoint
# run in the background, and this shell stays PID 1, reaping orphaned processes.
/opt/opensandbox/execd &
if [ "$#" -eq 0 ]; then
	set -- tail -f /dev/null
fi
"$@" &
entry=$!
trap 'kill -TERM "$entry" 2>/dev/null' TERM INT
while kill -0 "$entry" 2>/dev/null; do
	wait "$entry"
done
