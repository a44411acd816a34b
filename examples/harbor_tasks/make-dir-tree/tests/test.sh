#!/bin/bash
# Verifier for make-dir-tree: checks every entry of /app/project and that nothing else is there.
mkdir -p /logs/verifier
P=/app/project
problems=()

fail_if() { problems+=("$1"); }

if [ ! -d "$P" ]; then
  echo "FAIL: /app/project does not exist or is not a directory"
  echo 0 > /logs/verifier/reward.txt
  exit 1
fi
for d in src tests docs docs/api; do
  [ -d "$P/$d" ] || fail_if "$P/$d is missing or is not a directory"
done
for d in tests docs/api; do
  if [ -d "$P/$d" ] && [ -n "$(ls -A "$P/$d")" ]; then fail_if "$P/$d should be empty but contains: $(ls -A "$P/$d" | tr '\n' ' ')"; fi
done
if [ ! -f "$P/src/__init__.py" ]; then
  fail_if "$P/src/__init__.py is missing or is not a regular file"
elif [ -s "$P/src/__init__.py" ]; then
  fail_if "$P/src/__init__.py should be empty (0 bytes) but has $(wc -c < "$P/src/__init__.py") bytes"
fi
if [ ! -f "$P/README.md" ]; then
  fail_if "$P/README.md is missing"
elif ! cmp -s "$P/README.md" /app/template/README.md; then
  fail_if "$P/README.md is not an exact copy of /app/template/README.md (copy the file rather than retyping it)"
fi
extra=$(cd "$P" && find . -mindepth 1 | sed 's|^\./||' | grep -vxE 'README.md|docs|docs/api|src|src/__init__.py|tests' | head -5)
if [ -n "$extra" ]; then fail_if "unexpected entries inside /app/project: $(echo $extra)"; fi

if [ ${#problems[@]} -eq 0 ]; then
  echo "PASS: /app/project has exactly the requested tree"
  echo 1 > /logs/verifier/reward.txt
  exit 0
fi
echo "FAIL: the tree under /app/project is not as requested:"
printf ' - %s\n' "${problems[@]}"
echo 0 > /logs/verifier/reward.txt
exit 1
