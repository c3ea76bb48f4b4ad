#!/usr/bin/env bash
# One-time set-up on a fresh machine: Java and the Fashion-MNIST files (Debian packages),
# a virtual environment in .venv with distkeras and its test tools. Safe to run again.
#
#   --backends   also install the torch (CPU) and tensorflow Keras backends, which the
#                tests exercise (the README's test command passes it; 2.4 GB, ~40 s).
set -euo pipefail
cd "$(dirname "$0")/.."

WITH_BACKENDS=0
for arg in "$@"; do
    case "$arg" in
        --backends) WITH_BACKENDS=1 ;;
        *) echo "setup.sh: unknown option '$arg' (the only option is --backends)" >&2; exit 2 ;;
    esac
done

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need_apt+=(dataset-fashion-mnist)
if [ ${#need_apt[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import distkeras, pytest, xdist, pytest_timeout, hypothesis, keras, jax, pyspark, grpc, mkdocs" >/dev/null 2>&1 \
        || [ pyproject.toml -nt .venv/.distkeras-installed ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[test]"
    touch .venv/.distkeras-installed
fi
if [ "$WITH_BACKENDS" = 1 ]; then
    if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('torch') and u.find_spec('tensorflow')))" \
            || [ pyproject.toml -nt .venv/.distkeras-backends ]; then
        .venv/bin/python -m pip install -q -e ".[test,backends]"
        touch .venv/.distkeras-backends
    fi
fi
