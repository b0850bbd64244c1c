"""`python -m kvstore --connect ADDR --identity kvstore#N`: the router starts one per service
and sends its settings in the handshake. `--bind ADDR --root DIR [...]` runs one standalone
(tests, tools)."""

from __future__ import annotations

import os
import sys

_PARENT_PID = os.getppid()  # taken first: a parent that dies during startup is still seen

from kvstore.config import make_parser, standalone_config
from kvstore.main import run_kvstore, run_supervised_kvstore


def main() -> int:
    parser = make_parser()
    args = parser.parse_args()
    if args.connect:
        if not args.identity:
            parser.error("--connect needs --identity")
        return run_supervised_kvstore(args.connect, args.identity, parent_pid=_PARENT_PID)
    try:
        config = standalone_config(args)
    except ValueError as exc:
        sys.stderr.write(f"python -m kvstore: error: {exc}\n")
        return 2
    return run_kvstore(config, parent_pid=_PARENT_PID)


if __name__ == "__main__":
    sys.exit(main())
