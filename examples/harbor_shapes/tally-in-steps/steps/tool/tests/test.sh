#!/bin/bash
source /tests/helpers.sh
mkdir -p /logs/verifier
sample=$(mktemp)
printf 'zed 2\namy 1\n\nzed 40\nbo 7\n' > "$sample"
want=$'amy 1\nbo 7\nzed 42'
problem=""
if [ ! -f /app/tally.py ]; then problem="/app/tally.py does not exist"
else
  got=$(python3 /app/tally.py "$sample" 2>&1) || problem="python3 /app/tally.py FILE exited $?: $got"
  [ -z "$problem" ] && [ "$got" != "$want" ] && problem="on the sample it printed $(printf %q "$got"), expected $(printf %q "$want")"
fi
rm -f "$sample"
verdict "$problem"
