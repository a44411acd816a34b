#!/bin/bash
# Verifier for fix-backup-script: reruns /app/backup.sh from a clean state, with one more .conf file
# (its name has a space), and checks the copies, the log line and the exit status.
mkdir -p /logs/verifier
fail() { echo "FAIL: $1"; echo 0 > /logs/verifier/reward.txt; exit 1; }
S=/app/backup.sh

[ -f "$S" ] || fail "$S is missing"
grep -q '^set -euo pipefail' "$S" || fail "$S must keep 'set -euo pipefail'"
bash -n "$S" 2>/tmp/syntax || fail "$S has a syntax error: $(head -3 /tmp/syntax)"

rm -rf /app/backup /app/backup.log
printf 'cache_size = 64\n' > '/app/etc/extra cache.conf'
out=$(cd / && timeout 10 bash "$S" 2>&1)
rc=$?
rm -f '/app/etc/extra cache.conf'
[ $rc -ne 124 ] || fail "bash $S did not finish within 10 s"
if [ $rc -ne 0 ]; then
  [ -n "$out" ] || out="(it printed nothing: under set -e some command returned a non-zero status without an error message)"
  fail "bash $S (run with no /app/backup folder yet) exited with status $rc: $(printf '%s' "$out" | tail -3)"
fi
[ -d /app/backup ] || fail "bash $S exited 0 but /app/backup/ does not exist"

want=$(cd /app/etc && ls -1 -- *.conf | sort; echo 'extra cache.conf')
want=$(printf '%s\n' "$want" | sort)
have=$(ls -1A /app/backup | sort)
if [ "$have" != "$want" ]; then
  missing=$(comm -23 <(printf '%s\n' "$want") <(printf '%s\n' "$have") | paste -sd, -)
  extra=$(comm -13 <(printf '%s\n' "$want") <(printf '%s\n' "$have") | paste -sd, -)
  fail "/app/backup/ does not hold exactly the .conf files of /app/etc${missing:+; missing: $missing}${extra:+; unexpected: $extra}"
fi
for f in /app/etc/*.conf; do
  cmp -s "$f" "/app/backup/$(basename "$f")" || fail "/app/backup/$(basename "$f") differs from $f"
done
n=$(printf '%s\n' "$want" | wc -l)
[ -f /app/backup.log ] || fail "bash $S did not write /app/backup.log"
log=$(cat /app/backup.log)
[ "$log" = "backed up $n files" ] || fail "/app/backup.log holds '$log' after copying $n files; it should be the line 'backed up N files' with N the number copied"
echo "PASS: $S copies every .conf file, logs the count and exits 0"
echo 1 > /logs/verifier/reward.txt
exit 0
