"""Real datasets as Spark DataFrames, and datasets written to Parquet, under their import
path.

A thin face: the functions live in `distkeras.data.datasets` (see there).
"""

from distkeras.data.datasets import (FASHION_MNIST_CLASSES, FASHION_MNIST_DIR, PARQUET_MODES,
                                     default_cache_dir, float_lists, load_fashion_mnist,
                                     load_fashion_mnist_numpy, read_idx, save_numpy_parquet,
                                     save_parquet, to_arrow_table, write_parquet)

__all__ = ["FASHION_MNIST_CLASSES", "FASHION_MNIST_DIR", "PARQUET_MODES", "default_cache_dir",
           "float_lists", "load_fashion_mnist", "load_fashion_mnist_numpy", "read_idx",
           "save_numpy_parquet", "save_parquet", "to_arrow_table", "write_parquet"]
