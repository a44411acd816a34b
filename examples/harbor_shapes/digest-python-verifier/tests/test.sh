#!/usr/bin/env python3
# A Python verifier: Harbor runs tests/test.sh by its own shebang, not with bash.
import hashlib, json, os
os.makedirs("/logs/verifier", exist_ok=True)
want = hashlib.sha256(open("/app/blob.bin", "rb").read()).hexdigest()
try:
    got = open("/app/blob.sha256").read().split()[0].lower() if os.path.getsize("/app/blob.sha256") else ""
except OSError:
    got = None
ok = got == want
print("PASS" if ok else "FAIL: /app/blob.sha256 " + ("does not exist" if got is None else "holds a wrong digest"))
json.dump({"reward": 1.0 if ok else 0.0}, open("/logs/verifier/reward.json", "w"))
