"""Generates a Punchcard secret: python scripts/generate_secret.py --identity userX"""

import sys

from distkeras.punchcard.commands import secret_command

if __name__ == "__main__":
    sys.exit(secret_command())
