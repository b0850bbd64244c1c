"""Unknown request fields are ignored and logged once per field, never refused."""

from __future__ import annotations

import logging

import pytest

from router.api import openai_chat
from router.api.unknown_fields import OPENAI_CHAT_FIELDS, note_unknown_fields


def test_logged_once_per_field(caplog: pytest.LogCaptureFixture) -> None:
    body = {"model": "m", "messages": [], "client_metadata": {}, "reasoning": {"effort": "low"}}
    with caplog.at_level(logging.INFO, logger="router.api.unknown_fields"):
        assert note_unknown_fields("test-route", body, OPENAI_CHAT_FIELDS) == ["client_metadata", "reasoning"]
        note_unknown_fields("test-route", body, OPENAI_CHAT_FIELDS)
    assert caplog.text.count("ignoring field 'client_metadata'") == 1
    assert caplog.text.count("ignoring field 'reasoning'") == 1


def test_a_chat_body_with_unknown_fields_and_developer_role_parses() -> None:
    parsed = openai_chat.parse({
        "model": "m", "store": False, "metadata": {"a": "b"},
        "messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                     {"role": "user", "content": "hi"}],
    })
    assert parsed.add.messages[0] == {"role": "system", "content": "Be brief."}
