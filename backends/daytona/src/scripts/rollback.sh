# sh -c SCRIPT berth-rollback TEMP DIR...: removes a failed write's temp file and the
# directories write.sh created for it (the caller passes them innermost first), each only
# while empty.
rm -f -- "$1"
shift
for created; do
	rmdir -- "$created" 2>/dev/null
done
echo berth-ok
