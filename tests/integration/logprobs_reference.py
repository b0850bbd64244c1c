"""A served model's logprobs against an independent reference: stock MLX on the same weights
dequantized to float32 (tests/integration/stock_logprobs.py, run in a process with nothing
of mlxd), on the same prompt tokens and the tokens the service chose."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCE_TOP = 20  # the reference's alternatives per step: the served ones (at most 20) are among them


@dataclass
class Step:
    """One generated token: its bytes and log-probability, and the most likely tokens
    (bytes, log-probability), best first."""

    token: bytes
    logprob: float
    top: list[tuple[bytes, float]]


def text_bytes(token: str) -> bytes:
    """The bytes of a completions `tokens`/`top_logprobs` name (`bytes:\\xNN...` for part of a character)."""
    if token.startswith("bytes:\\x"):
        return bytes(int(part, 16) for part in token.removeprefix("bytes:").split("\\x")[1:])
    return token.encode()


class StockReference:
    """The reference process for one model directory: loads (and dequantizes) once, then
    answers each `steps` call; `close` ends it."""

    def __init__(self, model_dir: Path) -> None:
        # cwd: a directory without mlxd's packages, so the reference cannot import them by accident
        self._proc = subprocess.Popen([sys.executable, str(HERE / "stock_logprobs.py"), str(model_dir)], cwd=HERE,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def steps(self, cases: list[tuple[list[int], list[Step]]], perturb: float | None = None) -> list[list[Step]]:
        """The reference's steps for each (prompt ids, served steps): at each served token,
        its log-probability in stock MLX and stock MLX's REFERENCE_TOP most likely tokens."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        request = {"cases": [{"prompt": prompt, "continuation": [s.token.hex() for s in steps]}
                             for prompt, steps in cases], "top": REFERENCE_TOP, "perturb": perturb}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        assert line, f"the reference process exited with {self._proc.wait()}"
        answer = json.loads(line)
        assert answer["dtypes"] == ["mlx.core.float32"] and answer["dequantized_layers"] > 0, answer
        return [[Step(mine.token, theirs["logprob"], [(bytes.fromhex(raw), value) for raw, value in theirs["top"]])
                 for mine, theirs in zip(served, steps, strict=True)]
                for (_, served), steps in zip(cases, answer["cases"], strict=True)]

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def max_difference(served: list[Step], reference: list[Step]) -> float:
    """The largest |served - reference| over every served figure: each token's own
    log-probability and each alternative's (an alternative the reference does not rank
    among its REFERENCE_TOP counts as infinitely far)."""
    assert len(served) == len(reference)
    worst = 0.0
    for mine, theirs in zip(served, reference):
        known = dict(theirs.top)
        worst = max(worst, abs(mine.logprob - theirs.logprob))
        for token, value in mine.top:
            worst = max(worst, abs(value - known[token]) if token in known else float("inf"))
    return worst


def assert_same_choices(served: list[Step], reference: list[Step], tolerance: float) -> None:
    """Greedy picks the reference's most likely token, and the served alternatives are the
    reference's most likely ones, best first: up to ties within `tolerance`, where the two
    computations may order them either way."""
    for i, (mine, theirs) in enumerate(zip(served, reference)):
        best = theirs.top[0][1]
        assert theirs.logprob >= best - tolerance, (i, mine.token, theirs.logprob, theirs.top[:3])
        if not mine.top:
            continue
        values = [v for _, v in mine.top]
        assert values == sorted(values, reverse=True), (i, mine.top)
        chosen = {token for token, _ in mine.top}
        floor = values[-1]
        missing = [(t, v) for t, v in theirs.top if v > floor + tolerance and t not in chosen]
        assert not missing, (i, missing, mine.top)
