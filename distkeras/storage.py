"""Bytes to and from any path the cluster's filesystem understands, under its old import
path.

A thin face: the names live in `distkeras.data.storage` (see there).
"""

from distkeras.data.storage import (CHUNK_BYTES, HadoopFS, is_directory, read_bytes,
                                    check_writable, replacing_local_file, atomic_writer,
                                    write_bytes)

__all__ = ["CHUNK_BYTES", "HadoopFS", "is_directory", "read_bytes", "check_writable",
           "replacing_local_file", "atomic_writer", "write_bytes"]
