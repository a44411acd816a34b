#!/bin/bash
set -e
grep -E '^port *=' /opt/tool/etc/tool.ini | head -1 | sed -E 's/^port *= *//' > /app/port.txt
