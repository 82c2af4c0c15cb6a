# Stasis's grader for a Harbor task (docs/tasks.md), run by `sh` as the verifier sandbox's first
# process. That sandbox's root is the task's environment image as built: every program,
# interpreter and library the tests run comes from there, never from the agent's layer. The
# agent's final tree is at /episode: read-only, noexec, and no symlink in it is followed.
# Its last line is the one `reward.py` reads: stasis-task exit=<code> <reward file> <content>.
set -u
. /.stasis-task/env
work=$(pwd)  # the image's WORKDIR, where Harbor runs the tests

# The agent's files at their own paths: copied (tests may write beside them), symlinks as links
# (they resolve in this sandbox, never on the node), set-id bits dropped.
for path in ${STASIS_GRADED:-$work}; do
  [ "$path" != / ] && [ -d "/episode$path" ] || continue
  mkdir -p "$path" && cp -a "/episode$path/." "$path/" \
    || { echo "stasis: the agent's $path could not be copied for the tests" >&2; exit 70; }
  find "$path" -xdev -type f -perm /6000 -exec chmod ug-s {} + || exit 70
done

# The reward channel starts empty, whatever the image holds there.
rm -rf /logs/verifier && mkdir -p /logs/verifier /logs/agent || exit 70
find /tests -type f -exec chmod 0755 {} + || exit 70
cd "$work" || exit 70
timeout -k 5 "$STASIS_TEST_TIMEOUT" bash /tests/test.sh >/logs/verifier/test-stdout.txt 2>&1 </dev/null
code=$?
# Nothing the tests started writes a reward after this: every other process here is killed.
kill -s KILL -1 2>/dev/null
tail -c 49152 /logs/verifier/test-stdout.txt

one_line() { tr -d '\r\n' <"$1" | head -c 65536; }
if [ -f /logs/verifier/reward.json ] && [ ! -L /logs/verifier/reward.json ]; then
  echo "stasis-task exit=$code reward.json $(one_line /logs/verifier/reward.json)"
elif [ -f /logs/verifier/reward.txt ] && [ ! -L /logs/verifier/reward.txt ]; then
  echo "stasis-task exit=$code reward.txt $(one_line /logs/verifier/reward.txt)"
else
  echo "stasis-task exit=$code none"
fi
