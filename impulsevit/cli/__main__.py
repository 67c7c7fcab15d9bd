"""``python -m impulsevit.cli ...``: the ``impulsevit`` command (as tests, the study launcher and DDP re-launch
run it)."""

import sys

from impulsevit.cli import main

if __name__ == "__main__":
    sys.exit(main())
