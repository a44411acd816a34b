#!/bin/bash
# Verifier for count-unique-ips: /app/unique_ips.txt must hold the number of distinct first fields of /app/access.log.
mkdir -p /logs/verifier
out=/app/unique_ips.txt
expected=11
lines=60
fail() { echo "FAIL: $1"; echo 0 > /logs/verifier/reward.txt; exit 1; }

[ -f "$out" ] || fail "$out does not exist; write the count there"
got=$(tr -d '\r' < "$out" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//' | grep . )
[ -n "$got" ] || fail "$out is empty"
[ "$(printf '%s\n' "$got" | wc -l)" -eq 1 ] || fail "$out has several non-empty lines; write only one integer"
[[ "$got" =~ ^[0-9]+$ ]] || fail "$out holds '$got', which is not a plain integer (write only the number)"
if [ "$got" -eq "$expected" ]; then
  echo "PASS: the distinct IP count is right"
  echo 1 > /logs/verifier/reward.txt
  exit 0
fi
if [ "$got" -eq "$lines" ]; then
  fail "$out holds $got, which is the number of lines (requests), not of distinct IPs; an IP that appears several times counts once"
elif [ "$got" -gt "$expected" ]; then
  fail "$out holds $got, too many: some IPs were counted more than once (note: 'uniq' only merges adjacent duplicates)"
else
  fail "$out holds $got, too few: some distinct IPs were missed or merged (compare the whole first field, e.g. 10.0.0.1 and 10.0.0.12 are different)"
fi
