import sys

from devtools.bench.harness import main

sys.exit(main())
