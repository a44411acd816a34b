#!/bin/bash
source /tests/helpers.sh
mkdir -p /logs/verifier
problem=""
if [ -e /app/setup.sh ]; then problem="the step's setup.sh did not run"
elif [ "$(/app/greet.sh 2>&1)" != "$EXPECTED_GREETING" ]; then problem="/app/greet.sh does not print the greeting for the name in /app/config/name.txt"
fi
verdict "$problem"
