import sys

from rewheel.bench.harness import main

sys.exit(main())
