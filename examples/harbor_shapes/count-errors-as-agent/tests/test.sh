#!/bin/bash
     # Runs as root ([verifier] user): it reads /root/expected-errors, which only root can, and checks
     # that the agent, which runs as the user "agent", wrote the answer itself.
     mkdir -p /logs/verifier
     problem=""
     if [ "$(id -u)" != 0 ]; then problem="the verifier is not running as root"
     elif [ ! -f /app/errors.txt ]; then problem="/app/errors.txt does not exist"
     elif [ "$(stat -c %U /app/errors.txt)" != agent ]; then problem="/app/errors.txt was not written by the agent's user"
     elif [ "$(tr -d '[:space:]' < /app/errors.txt)" != "$(cat /root/expected-errors)" ]; then problem="/app/errors.txt holds a wrong count"
     fi

if [ -z "$problem" ]; then echo "PASS"; echo 1 > /logs/verifier/reward.txt; else echo "FAIL: $problem"; echo 0 > /logs/verifier/reward.txt; fi
