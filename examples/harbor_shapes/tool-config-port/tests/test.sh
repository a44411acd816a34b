#!/bin/bash
     # RUN before WORKDIR: /opt/tool/etc/tool.ini came from a RUN that ran in /, before any WORKDIR.
     mkdir -p /logs/verifier
     problem=""
     if [ ! -f /app/port.txt ]; then problem="/app/port.txt does not exist"
     elif [ "$(tr -d '[:space:]' < /app/port.txt)" != "7431" ]; then
       problem="/app/port.txt holds '$(head -c 40 /app/port.txt)', not the [server] port of /opt/tool/etc/tool.ini"
     fi

if [ -z "$problem" ]; then echo "PASS"; echo 1 > /logs/verifier/reward.txt; else echo "FAIL: $problem"; echo 0 > /logs/verifier/reward.txt; fi
