"""``python -m distkeras.cli``: the ``distkeras`` command (`distkeras.cli.main`), as
Punchcard runs its jobs."""

import sys

from distkeras.cli import main

if __name__ == "__main__":
    sys.exit(main())
