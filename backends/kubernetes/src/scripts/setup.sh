# At every provision: checks that the workspace root is a writable directory of this user.
[ ! -L "$W" ] || { echo "berth-error escape" >&2; exit 86; }
[ -d "$W" ] && [ -w "$W" ] || { echo "berth-error notwritable" >&2; exit 86; }
mkdir -p -m 0700 -- "$S/run" "$S/stage" || { echo "berth-error private" >&2; exit 86; }
