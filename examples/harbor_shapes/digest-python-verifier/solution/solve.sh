#!/bin/bash
sha256sum /app/blob.bin | cut -d' ' -f1 > /app/blob.sha256
