#!/bin/bash
sed -i 's/^DEST_DIR=\/app\/backup$/&\nmkdir -p "$DEST_DIR"/; s/((count++))/count=$((count + 1))/' /app/backup.sh
bash /app/backup.sh
