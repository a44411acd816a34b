#!/bin/bash
printf '#!/bin/bash\necho "Hello, $(head -n 1 /app/config/name.txt)!"\n' > /app/greet.sh
chmod +x /app/greet.sh
