#!/bin/bash
# Copy every .conf file from /app/etc into /app/backup/ and log how many were copied.
set -euo pipefail

SRC_DIR=/app/etc
DEST_DIR=/app/backup

count=0
for f in "$SRC_DIR"/*.conf; do
    cp "$f" "$DEST_DIR/"
    ((count++))
done

echo "backed up $count files" > /app/backup.log
