#!/bin/bash
# Verifier for largest-file: /app/largest.txt must hold the bare name of the largest file under /app/data.
mkdir -p /logs/verifier
out=/app/largest.txt
fail() { echo "FAIL: $1"; echo 0 > /logs/verifier/reward.txt; exit 1; }

[ -f "$out" ] || fail "$out does not exist; write the file name there"
[ "$(grep -c . "$out")" -le 1 ] || fail "$out has more than one non-empty line; write only the one file name"
got=$(tr -d '\r' < "$out" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//' | grep . | head -1)
[ -n "$got" ] || fail "$out is empty"
case "$got" in
  */*) fail "$out holds '$got', which includes a directory part; write only the file's name" ;;
esac
[ -n "$(find /app/data -type f -name "$got" 2>/dev/null | head -1)" ] || fail "'$got' is not the name of any file under /app/data"
if [ "$got" != "dump.sql" ]; then
  size=$(find /app/data -type f -name "$got" -printf '%s' -quit)
  fail "'$got' ($size bytes) is not the largest file under /app/data; compare sizes in bytes of every file, in all subdirectories"
fi
echo "PASS: $out names the largest file"
echo 1 > /logs/verifier/reward.txt
exit 0
