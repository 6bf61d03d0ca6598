# In the secret holder's container: set -- PIN: copies stdin (the program, read from the
# workspace by the gateway) into a fresh 0700 directory, checks its SHA-256 against PIN and
# prints the directory. The agent can neither see nor write it.
umask 077
d=$(mktemp -d /tmp/berth-secret.XXXXXXXX) || { echo "berth-error private" >&2; exit 86; }
cat >"$d/program" || { rm -rf -- "$d"; echo "berth-error io" >&2; exit 86; }
sum=$(sha256sum -- "$d/program") || { rm -rf -- "$d"; echo "berth-error io" >&2; exit 86; }
if [ "${sum%% *}" != "$1" ]; then
	rm -rf -- "$d"
	echo "berth-error pin" >&2
	exit 86
fi
chmod 0700 -- "$d/program"
printf '%s' "$d"
