#!/usr/bin/env bash
# LibTorch for the `tch` backend, from PyPI's `torch` wheel: 2.11.0 by default (what the lent
# GPU machines have: a binary built against it runs there on that machine's own torch), or
# TORCH_VERSION. `torch-sys` 0.22 was written for 2.9.0 and checks the version; `env.sh` sets
# LIBTORCH_BYPASS_VERSION_CHECK for any other (2.11's C++ API is what tch 0.22 calls: it
# builds and runs, see the book's backends page). PyPI's Linux wheel is the CUDA build
# (2.11.0: CUDA 13.0): pip also installs the NVIDIA runtime libraries it links to (about
# 4.5 GB in all), which load on a machine without a GPU too.
#
#   bash examples/scripts/install-libtorch.sh          # into .venv-libtorch (or $1)
#   source .venv-libtorch/env.sh
#   cargo run --release -p examples --features tch --bin nanogpt -- ...
#
# `env.sh` sets what the build and the binaries need: LIBTORCH_USE_PYTORCH=1 with the venv's
# python first on PATH (torch-sys asks it where torch lives), and LD_LIBRARY_PATH to
# torch/lib (the binaries link libtorch dynamically, libtorch_cuda among it: check with
# `readelf -d BINARY | grep NEEDED`).
set -euo pipefail
venv="${1:-.venv-libtorch}"
python3 -m venv "$venv"
version="${TORCH_VERSION:-2.11.0}"
"$venv/bin/pip" install --quiet --progress-bar off "torch==$version" numpy
lib="$("$venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
cat > "$venv/env.sh" <<ENV
export PATH="$(cd "$venv" && pwd)/bin:\$PATH"
export LIBTORCH_USE_PYTORCH=1
$([ "$version" = 2.9.0 ] || echo "export LIBTORCH_BYPASS_VERSION_CHECK=1")
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
ENV
echo "LibTorch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') in $lib"
echo "now: source $venv/env.sh"
