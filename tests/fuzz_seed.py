"""One seed for every Hypothesis fuzzer that is not derandomized, so a failure seen in CI
can be replayed: `.ci/run` prints MLXD_FUZZ_SEED, and the same value reruns the same
examples. Unset, each session picks its own (new examples every run) and the report
header names it."""

from __future__ import annotations

import os
import secrets

FUZZ_SEED: int = int(os.environ.get("MLXD_FUZZ_SEED") or secrets.randbelow(2**32))
