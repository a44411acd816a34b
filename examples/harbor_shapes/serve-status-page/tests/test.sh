#!/bin/bash
# The server must be running after the agent (or solve.sh) finished: started in the background.
mkdir -p /logs/verifier
python3 - <<'PY'
import json, urllib.request
try:
    with urllib.request.urlopen("http://127.0.0.1:8765/status.json", timeout=5) as r:
        body = json.load(r)
    ok = body == {"status": "green", "build": 1542}
    print("PASS" if ok else f"FAIL: /status.json served {body!r}, not /app/site/status.json")
except Exception as e:
    ok = False
    print(f"FAIL: nothing serves http://127.0.0.1:8765/status.json ({type(e).__name__}: {e})")
open("/logs/verifier/reward.txt", "w").write("1\n" if ok else "0\n")
PY
