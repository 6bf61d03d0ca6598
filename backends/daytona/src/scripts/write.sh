# sh -c SCRIPT berth-write REL MODE GENERATION GENFILE: prepares an atomic write of REL.
# Refuses a fenced handle, resolves REL creating its missing parents, and prints
# "berth-ok R MODE CREATED..." (base64 fields): the resolved path below the root, the mode
# the file gets (an existing file keeps its own) and the directories it created, which
# `finish.sh` or `rollback.sh` remove again when the upload fails.
berth_fail() {
	berth_rollback
	printf 'berth-error %s\n' "$1"
	exit 86
}
rel=$1
mode=$2
berth_fence "$3" "$4"
berth_resolve "$rel" 1
[ -n "$R" ] || berth_fail isdir
p=$W/$R
[ ! -d "$p" ] || berth_fail isdir
if [ -f "$p" ]; then
	mode=$(stat -c %a -- "$p") || berth_fail io
fi
printf 'berth-ok '
printf '%s' "$R" | base64 | tr -d '\n'
printf ' %s' "$mode"
i=1
while [ "$i" -le "$ncreated" ]; do
	eval "created=\$created_$i"
	printf ' '
	printf '%s' "$created" | base64 | tr -d '\n'
	i=$((i + 1))
done
printf '\n'
