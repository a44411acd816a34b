#!/bin/bash
# Verifier for fix-inclusive-sum: runs /tests/test_rangeutils.py (stdlib only) against range_sum in /app/rangeutils.py with a time limit.
mkdir -p /logs/verifier
cd /app
timeout 10 python3 -B /tests/test_rangeutils.py
rc=$?
if [ $rc -eq 124 ]; then
  echo "FAIL: the tests did not finish within 10 s: the function probably loops forever on some input"
fi
if [ $rc -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; exit 0; fi
echo 0 > /logs/verifier/reward.txt
exit 1
