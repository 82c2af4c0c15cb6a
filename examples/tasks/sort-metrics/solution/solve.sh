#!/bin/bash
set -e
cd /app
sort -n numbers.txt > sorted.txt
total=0
while read -r n; do total=$((total + n)); done < numbers.txt
echo "$total" > sum.txt
