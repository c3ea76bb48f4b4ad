"""`distkeras.executor.affinity` under its former import path.

A thin face: this name is that module itself, so scripts and tests that set its
``LOCK_FOLDER`` or replace one of its functions change the executor's own.
"""

import sys

from distkeras.executor import affinity

sys.modules[__name__] = affinity
