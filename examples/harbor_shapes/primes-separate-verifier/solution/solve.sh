#!/bin/bash
echo "working notes" > /app/scratch.txt
python3 -c "import json; json.dump({'primes': [p for p in range(2, 50) if all(p % d for d in range(2, p))]}, open('/app/result.json', 'w'))"
