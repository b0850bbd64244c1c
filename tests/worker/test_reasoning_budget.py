"""The thinking budget forces the close marker after `budget` reasoning tokens, leaves a
span the model closes itself alone, and never touches an answer that does not reason."""

from __future__ import annotations

import mlx.core as mx

from worker.reasoning_budget import ReasoningBudget

WORDS = ["<think>", "</think>", "\n", "a", "b", "c", "\n\n"]  # token id -> text


class Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, rest = [], text
        while rest:
            token = max((i for i, w in enumerate(WORDS) if rest.startswith(w)), key=lambda i: len(WORDS[i]))
            ids.append(token)
            rest = rest[len(WORDS[token]):]
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(WORDS[i] for i in ids)


def run(budget: int, opens_in_prompt: bool, choose: list[int], steps: int) -> list[int]:
    """Greedy generation where the model, left alone, would write `choose` (then "a")."""
    processor = ReasoningBudget(Tokenizer(), "<think>", "</think>", opens_in_prompt, budget)
    context, out = [0], []
    for step in range(steps):
        wanted = choose[step] if step < len(choose) else 3
        logits = mx.zeros((1, len(WORDS))).at[0, wanted].add(5.0)
        token = int(mx.argmax(processor(mx.array(context), logits), axis=-1).item())
        context.append(token)
        out.append(token)
    return out


def test_the_span_closes_after_the_budget_and_the_answer_follows() -> None:
    assert run(2, True, [4, 4, 4, 4, 4], 8) == [4, 4, 2, 1, 6, 3, 3, 3]  # b b, then "\n</think>\n\n", then a


def test_a_budget_of_zero_closes_at_once() -> None:
    assert run(0, True, [4, 4], 5) == [2, 1, 6, 3, 3]


def test_a_span_the_model_opens_counts_from_its_opening() -> None:
    assert run(1, False, [0, 5, 5, 5], 6) == [0, 5, 2, 1, 6, 3]


def test_a_span_closed_within_the_budget_and_an_answer_without_one_are_left_alone() -> None:
    assert run(5, True, [4, 1, 5, 5, 5, 5, 5], 7) == [4, 1, 5, 5, 5, 5, 5]
    assert run(1, False, [5] * 30, 30) == [5] * 30  # never opened: nothing forced
