#!/bin/bash
source /tests/helpers.sh
mkdir -p /logs/verifier
want=$'ada 7\nbob 6\ncy 10\nTOTAL 23'
problem=""
if [ ! -f /app/report.txt ]; then problem="/app/report.txt does not exist"
elif [ "$(cat /app/report.txt)" != "$want" ]; then problem="/app/report.txt holds $(printf %q "$(head -c 300 /app/report.txt)"), expected $(printf %q "$want")"
fi
verdict "$problem"
