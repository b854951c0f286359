import sys

from threadheap.cli import main

sys.exit(main())
