"""`python -m router` is the `mlxd` command."""

from router.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
