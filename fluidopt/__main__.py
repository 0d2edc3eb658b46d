import sys

from fluidopt.cli import main

sys.exit(main())
