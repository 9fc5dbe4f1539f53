#!/usr/bin/env bash
# LibTorch for the `tch` backend, from PyPI's `torch` wheel of the version `torch-sys` 0.22
# expects (2.9.0). PyPI's Linux wheel is the CUDA build: pip also installs the NVIDIA runtime
# libraries it links to (about 3 GB in all), which load on a machine without a GPU too.
#
#   bash examples/scripts/install-libtorch.sh          # into .venv-libtorch (or $1)
#   source .venv-libtorch/env.sh
#   cargo run --release -p examples --features tch --bin nanogpt -- ...
#
# `env.sh` sets what the build and the binaries need: LIBTORCH_USE_PYTORCH=1 with the venv's
# python first on PATH (torch-sys asks it where torch lives), and LD_LIBRARY_PATH to
# torch/lib (the binaries link libtorch dynamically).
set -euo pipefail
venv="${1:-.venv-libtorch}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --progress-bar off "torch==2.9.0"
lib="$("$venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
cat > "$venv/env.sh" <<ENV
export PATH="$(cd "$venv" && pwd)/bin:\$PATH"
export LIBTORCH_USE_PYTORCH=1
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
ENV
echo "LibTorch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') in $lib"
echo "now: source $venv/env.sh"
