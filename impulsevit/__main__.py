"""``python -m impulsevit ...``: the ``impulsevit`` command, the same entry as the console script
(:func:`impulsevit.cli.main`)."""

import sys

from impulsevit.cli import main

if __name__ == "__main__":
    sys.exit(main())
