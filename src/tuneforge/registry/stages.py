"""Stages of a fine-tuned model and the moves between them (pure data).

dev → staging → production moves a model towards serving; production → staging
and staging → dev step back; any stage → archived retires it, archived → dev
brings it back. Staging and production take only models whose gates passed,
unless an admin overrides (and the override is recorded with its reason)."""

from __future__ import annotations

STAGES = ("dev", "staging", "production", "archived")
GATED = frozenset({"staging", "production"})

MOVES: dict[str, frozenset[str]] = {
    "dev": frozenset({"staging", "archived"}),
    "staging": frozenset({"production", "dev", "archived"}),
    "production": frozenset({"staging", "archived"}),
    "archived": frozenset({"dev"}),
}


def can_move(current: str, target: str) -> bool:
    return target in MOVES.get(current, frozenset())
