#!/bin/bash
# The tool comes from the environment as built; the summary from the agent's /app.
expected=$(python3 /opt/stats/stats.pyc /app/data.txt)
if [ -f /app/summary.txt ] && [ "$(cat /app/summary.txt)" = "$expected" ]; then
  echo "PASS: $expected"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: expected $expected"
  echo 0 > /logs/verifier/reward.txt
fi
