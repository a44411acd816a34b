#!/bin/bash
# Verifier for fix-leap-year: runs /tests/test_calendar_utils.py (stdlib only) against is_leap in /app/calendar_utils.py with a time limit.
mkdir -p /logs/verifier
cd /app
timeout 10 python3 -B /tests/test_calendar_utils.py
rc=$?
if [ $rc -eq 124 ]; then
  echo "FAIL: the tests did not finish within 10 s: the function probably loops forever on some input"
fi
if [ $rc -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; exit 0; fi
echo 0 > /logs/verifier/reward.txt
exit 1
