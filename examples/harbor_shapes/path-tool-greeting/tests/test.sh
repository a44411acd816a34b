#!/bin/bash
     # ENV PATH=/opt/greeter/bin:$PATH: greet is on the PATH of every command, the tests' too.
     mkdir -p /logs/verifier
     problem=""
     want="$(greet harbor)"
     if [ ! -f /app/greeting.txt ]; then problem="/app/greeting.txt does not exist"
     elif [ "$(cat /app/greeting.txt)" != "$want" ]; then problem="/app/greeting.txt is not what 'greet harbor' prints"
     fi

if [ -z "$problem" ]; then echo "PASS"; echo 1 > /logs/verifier/reward.txt; else echo "FAIL: $problem"; echo 0 > /logs/verifier/reward.txt; fi
