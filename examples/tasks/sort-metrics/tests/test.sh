#!/bin/bash
# reward.json: each output is a metric (0 or 1), and the reward is their mean.
cd /app
sorted=0; sum=0
if [ -f sorted.txt ] && sort -n numbers.txt | cmp -s - sorted.txt; then sorted=1; fi
if [ -f sum.txt ] && [ "$(tr -d ' \n' < sum.txt)" = "$EXPECTED_SUM" ]; then sum=1; fi
echo "sorted=$sorted sum=$sum"
printf '{"reward": %s, "sorted": %d, "sum": %d}\n' "$(( (sorted + sum) * 5 ))e-1" "$sorted" "$sum" \
  > /logs/verifier/reward.json
