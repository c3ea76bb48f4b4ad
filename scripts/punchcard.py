"""Punchcard job server: python scripts/punchcard.py --secrets secrets.json --port 8000"""

import sys

from distkeras.punchcard.commands import serve

if __name__ == "__main__":
    sys.exit(serve())
