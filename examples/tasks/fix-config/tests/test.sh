#!/bin/bash
# Grades /app/config.ini as the agent left it: 1 if both keys changed and nothing else did.
expected=$'[service]\nname = demo\nport = 8080\ntls = on\nworkers = 4'
if [ "$(cat /app/config.ini 2>/dev/null)" = "$expected" ]; then
  echo "PASS: config.ini is as asked"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: config.ini is:"; cat /app/config.ini 2>&1
  echo 0 > /logs/verifier/reward.txt
fi
