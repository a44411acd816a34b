#!/bin/bash
     # [verifier] env EXPECTED_NAME and [environment] env GREETING_NAME both come from the host's
     # EVOLVEKIT_GREETING_NAME (default: harbor).
     mkdir -p /logs/verifier
     problem=""
     if [ -z "$EXPECTED_NAME" ]; then problem="the verifier's env EXPECTED_NAME is not set"
     elif [ ! -f /app/hello.txt ]; then problem="/app/hello.txt does not exist"
     elif [ "$(cat /app/hello.txt)" != "hello, $EXPECTED_NAME" ]; then problem="/app/hello.txt does not greet the name in GREETING_NAME"
     fi

if [ -z "$problem" ]; then echo "PASS"; echo 1 > /logs/verifier/reward.txt; else echo "FAIL: $problem"; echo 0 > /logs/verifier/reward.txt; fi
