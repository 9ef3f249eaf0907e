"""A lone surrogate (valid in JSON, not in UTF-8) never turns an answer into a 500."""

from __future__ import annotations

import json

from faust.web.drivers.aiohttp import Web as AiohttpWeb

from dlqapp.api.http import SurrogateSafeWeb
from dlqapp.core.requests import InvalidRequest, lone_surrogate, parse_request, without_lone_surrogates


def test_an_answer_showing_a_lone_surrogate_is_sent_with_it_replaced():
    shown = {"model": "gpt\ud800", "history": [{"k\udfff": ["ok", "\U0001f642"]}]}
    plain = AiohttpWeb.__new__(AiohttpWeb)
    try:
        plain.json(shown)
        raise AssertionError("Faust's own driver answers this: the test would prove nothing")
    except (TypeError, UnicodeEncodeError):
        pass
    answer = SurrogateSafeWeb.__new__(SurrogateSafeWeb).json(shown, status=200)
    assert answer.status == 200
    assert json.loads(answer.body) == {"model": "gpt?", "history": [{"k?": ["ok", "\U0001f642"]}]}


def test_a_request_holding_a_lone_surrogate_anywhere_is_invalid_and_a_pair_is_not():
    for raw in (
        rb'{"request_id": "a", "prompt": "x", "model": "gpt\ud800"}',
        rb'{"request_id": "a", "prompt": "x", "metadata": {"t": ["\uDFFF"]}}',
        rb'{"request_id": "a", "messages": [{"role": "user", "content": "\ud83d"}]}',
    ):
        try:
            parse_request(raw, 10_000)
        except InvalidRequest as exc:
            assert "lone UTF-16 surrogate" in exc.reasons[0] and exc.request_id == "a"
        else:
            raise AssertionError(raw)
    assert (
        parse_request(rb'{"request_id": "a", "prompt": "\ud83d\ude42 \\ud800"}', 10_000).prompt == "\U0001f642 \\ud800"
    )
    assert lone_surrogate({"a": ["\ud800"]}) and not lone_surrogate({"a": ["\U0001f642"]})
    assert without_lone_surrogates({"\ud800": 1}) == {"?": 1}


def test_an_answer_with_an_integer_past_64_bits_is_sent_all_the_same():
    shown = {"payload": {"seed": 18446744073709551616, "t": "\ud800"}}
    answer = SurrogateSafeWeb.__new__(SurrogateSafeWeb).json(shown, status=200)
    assert answer.status == 200 and answer.content_type == "application/json"
    assert json.loads(answer.body) == {"payload": {"seed": 18446744073709551616, "t": "?"}}
