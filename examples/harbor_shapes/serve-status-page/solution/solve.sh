#!/bin/bash
cd /app/site
nohup python3 -m http.server 8765 --bind 127.0.0.1 > /tmp/http.log 2>&1 &
for i in $(seq 50); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/', timeout=1)" 2>/dev/null && break
  sleep 0.1
done
