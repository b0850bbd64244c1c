"""`python -m worker --connect ADDR --identity ID`: the router starts one per model."""

from __future__ import annotations

import argparse
import sys

# Bind the BLAS before anything imports mlx.core (it resolves cblas_* at load time).
from worker.blas import bind_fast_blas

_BLAS = bind_fast_blas()

from worker.main import run_worker  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m worker", description="mlxd model worker (started by the router)")
    parser.add_argument("--connect", required=True, help="router's ipc:// address")
    parser.add_argument("--identity", required=True, help="this worker's socket identity")
    args = parser.parse_args()
    return run_worker(args.connect, args.identity, _BLAS)


if __name__ == "__main__":
    sys.exit(main())
