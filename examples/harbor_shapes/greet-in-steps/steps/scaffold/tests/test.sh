#!/bin/bash
source /tests/helpers.sh
mkdir -p /logs/verifier
problem=""
if [ ! -x /app/greet.sh ]; then problem="/app/greet.sh does not exist or is not executable"
elif [ "$(/app/greet.sh)" != hello ]; then problem="/app/greet.sh does not print hello"
fi
verdict "$problem"
