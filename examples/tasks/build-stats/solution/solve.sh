#!/bin/bash
set -e
python3 /opt/stats/stats.pyc /app/data.txt > /app/summary.txt
