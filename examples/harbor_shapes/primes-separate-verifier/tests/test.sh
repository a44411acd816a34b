#!/bin/bash
# Runs in a fresh container of the task's image: the agent's /app/result.json was collected as an
# artifact and put back at its path; nothing else the agent did is here.
mkdir -p /logs/verifier
python3 - <<'PY'
import json, os
want = [p for p in range(2, 50) if all(p % d for d in range(2, p))]
problem = ""
if os.path.exists("/app/scratch.txt"):
    problem = "the verifier sees /app/scratch.txt: it is not running in a separate environment"
elif not os.path.isfile("/app/result.json"):
    problem = "/app/result.json did not reach the verifier"
else:
    try:
        got = json.load(open("/app/result.json")).get("primes")
    except Exception as e:
        got = f"unreadable: {e}"
    if got != want:
        problem = f"primes is {str(got)[:80]}, not the primes below 50"
print("PASS" if not problem else "FAIL: " + problem)
open("/logs/verifier/reward.txt", "w").write("0\n" if problem else "1\n")
PY
