#!/bin/sh
# Entrypoint of OpenSandbox sandboxes that use the execd stand-in's image. The server copies
# this file and the daemon into the sandbox as /opt/opensandbox/bootstrap.sh and
# /opt/opensandbox/execd and starts the sandbox as `bootstrap.sh ENTRYPOINT...`: start the
# daemon in the background, then become the sandbox's own entrypoint.
/opt/opensandbox/execd &
if [ "$#" -eq 0 ]; then
	set -- tail -f /dev/null
fi
exec "$@"
