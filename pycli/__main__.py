import sys

from pycli.cli.app import main

sys.exit(main())
