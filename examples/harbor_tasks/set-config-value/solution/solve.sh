#!/bin/bash
sed -i 's/^port = 8080$/port = 9090/' /app/config/app.conf
