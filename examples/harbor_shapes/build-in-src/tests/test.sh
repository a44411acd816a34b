#!/bin/bash
     # dist/app.txt and /tmp/build-stamp: the agent's commands share a working directory, exported
     # variables and /tmp (one shell for the episode), and the tests see its /tmp.
     mkdir -p /logs/verifier
     problem=""
     want="orbit built in release mode from /app/src"
     if [ ! -f /app/src/dist/app.txt ]; then problem="/app/src/dist/app.txt does not exist: run the build script from /app/src"
     elif [ "$(cat /app/src/dist/app.txt)" != "$want" ]; then problem="dist/app.txt says '$(cat /app/src/dist/app.txt)'"
     elif [ "$(cat /tmp/build-stamp 2>/dev/null)" != "$want" ]; then problem="/tmp/build-stamp is missing or differs"
     fi

if [ -z "$problem" ]; then echo "PASS"; echo 1 > /logs/verifier/reward.txt; else echo "FAIL: $problem"; echo 0 > /logs/verifier/reward.txt; fi
