#!/bin/sh
# Install BLIS for MLX's CPU build on Debian-like Linux, if it is missing.
# MLX's CPU wheel bundles the reference BLAS (~3 GFLOP/s); the worker binds BLIS at start
# when it is installed (10-30x faster matmuls). Without it mlxd works, slower, and says so.
set -u
[ "$(uname -s)" = "Linux" ] || exit 0
for lib in /usr/lib/*-linux-gnu/blis-pthread/libblas.so.3; do
  [ -e "$lib" ] && exit 0
done
command -v apt-get >/dev/null 2>&1 || {
  echo "mlxd: no optimised BLAS found; install BLIS with your package manager for fast CPU inference" >&2
  exit 0
}
if [ "$(id -u)" -ne 0 ]; then
  echo "mlxd: CPU inference will be slow without BLIS. Run once:" >&2
  echo "  sudo apt-get install -y libblis4-pthread" >&2
  exit 0
fi
echo "mlxd: installing libblis4-pthread (optimised BLAS for MLX on CPU)" >&2
(apt-get install -y -qq libblis4-pthread >/dev/null 2>&1 ||
  (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libblis4-pthread >/dev/null 2>&1)) ||
  echo "mlxd: could not install libblis4-pthread; continuing with the slow reference BLAS" >&2
exit 0
