#!/bin/bash
# This verifier is broken on purpose: it needs a checker that the image does not have, so it
# fails before it writes /logs/verifier/reward.txt. Harbor records RewardFileNotFoundError and
# no reward; the harbor world calls it the environment failing (never 0.0, never 1.0).
set -e
mkdir -p /logs/verifier
/usr/local/bin/status-checker /app/status.txt
echo 1 > /logs/verifier/reward.txt
