#!/bin/bash
sed -i 's|return total_items // per_page + 1|return (total_items + per_page - 1) // per_page|' /app/pagination.py
