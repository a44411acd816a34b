# Shared by the steps' tests: copied to /tests/helpers.sh with each step's own tests.
verdict() {
  if [ -z "$1" ]; then echo PASS; echo 1 > /logs/verifier/reward.txt; else echo "FAIL: $1"; echo 0 > /logs/verifier/reward.txt; fi
}
