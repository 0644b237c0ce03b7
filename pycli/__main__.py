import sys

from pycli.cli import main

sys.exit(main())
