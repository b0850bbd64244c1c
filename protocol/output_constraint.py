"""A request's output constraint, as the router sends it and the worker enforces it
(protocol/constraints.py says what each kind means as a grammar)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Constraint:
    """What the generated text must match, enforced token by token by the worker's grammar
    engine (a mask on the logits), so it cannot be violated whatever the model prefers."""

    kind: str  # "json_object" (any JSON object), "json_schema" or "lark"
    # json_schema: the schema as JSON text; lark: a grammar in llguidance's Lark dialect
    # (which may embed %json{...} schemas); json_object: empty
    source: str = ""
    # A lazy constraint (a tool call in `tool_choice: auto`) holds nothing until the answer
    # writes a trigger, then holds the rest to the grammar (worker/lazy_grammar.py):
    triggers: list[str] = field(default_factory=list)  # anywhere; the grammar starts with the trigger's text
    markers: list[str] = field(default_factory=list)  # anywhere; the grammar starts after it (special tokens)
    start_triggers: list[str] = field(default_factory=list)  # only where the answer starts; as `triggers`
    rearm: bool = False  # after the grammar completes: free again (more calls may follow), else only EOS

    @property
    def lazy(self) -> bool:
        return bool(self.triggers or self.markers or self.start_triggers)
