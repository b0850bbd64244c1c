"""`python -m kvstore --bind ADDR --root DIR [...]`: the router starts one per service."""

from __future__ import annotations

import os
import sys

_PARENT_PID = os.getppid()  # taken first: a parent that dies during startup is still seen

from kvstore.config import make_config  # noqa: E402
from kvstore.main import run_kvstore  # noqa: E402


def main() -> int:
    try:
        config = make_config()
    except ValueError as exc:
        sys.stderr.write(f"python -m kvstore: error: {exc}\n")
        return 2
    return run_kvstore(config, parent_pid=_PARENT_PID)


if __name__ == "__main__":
    sys.exit(main())
