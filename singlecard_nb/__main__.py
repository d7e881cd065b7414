"""`python -m singlecard_nb [options] script.py args`: see singlecard_nb/cli/."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
