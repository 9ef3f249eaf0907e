"""Flow control's budgets over a fake clock: rate limits per model, the token bucket, and
the token estimate of a request."""

from __future__ import annotations

import pytest

from dlqapp.core.requests import Request
from dlqapp.flowcontrol.bucket import TokenBucket
from dlqapp.flowcontrol.estimate import DEFAULT_COMPLETION_TOKENS, estimate_tokens, used_tokens
from dlqapp.flowcontrol.limits import ModelLimit, parse_rate_limits
from tests.unit.fake_clock import seconds_clock

# -- limits ------------------------------------------------------------------------------


def test_rate_limits_parse_per_model_with_a_default():
    limits = parse_rate_limits("gpt-4o-mini=5000rpm/2000000tpm, gpt-4o=500rpm/30000tpm,*=1000rpm")
    assert limits.for_model("gpt-4o-mini") == ModelLimit(5000, 2_000_000)
    assert limits.for_model("gpt-4o") == ModelLimit(500, 30_000)
    assert limits.for_model("other") == ModelLimit(1000, None)
    assert parse_rate_limits("a=10TPM").for_model("b") is None  # no `*`: other models are not limited
    assert not parse_rate_limits("")


@pytest.mark.parametrize(
    "text, problem",
    [
        ("gpt-4o", "should be MODEL="),
        ("gpt-4o=fast", "not a limit"),
        ("gpt-4o=0rpm", "must be positive"),
        ("gpt-4o=1rpm/2rpm", "given twice"),
        ("a=1rpm,a=2rpm", "named twice"),
    ],
)
def test_bad_rate_limits_say_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_rate_limits(text)


# -- token bucket -------------------------------------------------------------------------


def test_bucket_refills_at_its_rate_up_to_its_capacity():
    clock = seconds_clock()
    bucket = TokenBucket(10, 5, clock)
    assert bucket.level == 0 and bucket.wait_s(1) == pytest.approx(0.1)
    clock.now += 10
    assert bucket.level == 5  # never above capacity
    bucket.take(5)
    assert bucket.wait_s(2) == pytest.approx(0.2)


def test_bucket_debt_is_repaid_before_anything_else_goes_and_more_than_capacity_waits_for_a_full_bucket():
    clock = seconds_clock()
    bucket = TokenBucket(100, 50, clock, initial=50)
    assert bucket.wait_s(500) == 0  # larger than the bucket: it goes once the bucket is full
    bucket.take(500)
    assert bucket.level == -450 and bucket.wait_s(1) == pytest.approx(4.51)
    bucket.give_back(400)  # the response said it used 100
    assert bucket.level == -50
    bucket.give_back(1000)
    assert bucket.level == 50  # never above capacity


def test_bucket_keeps_no_more_than_a_smaller_new_capacity():
    clock = seconds_clock()
    bucket = TokenBucket(10, 10, clock, initial=10)
    bucket.set_rate(5, 2.5)
    assert bucket.level == 2.5 and bucket.wait_s(3) == pytest.approx(0.0)  # more than capacity: a full bucket will do


# -- the estimate --------------------------------------------------------------------------


def _request(**kwargs) -> Request:
    return Request(
        request_id="r",
        model=None,
        messages=kwargs.pop("messages", None),
        prompt=kwargs.pop("prompt", None),
        params=kwargs.pop("params", {}),
        metadata={},
    )


def test_estimate_is_a_quarter_of_the_characters_plus_per_message_overhead_plus_the_completion_budget():
    assert estimate_tokens(_request(prompt="x" * 400)) == 100 + 4 + DEFAULT_COMPLETION_TOKENS
    messages = [
        {"role": "system", "content": "y" * 10},
        {
            "role": "user",
            "content": [{"type": "text", "text": "z" * 7}, {"type": "image_url", "image_url": {"url": "u" * 999}}],
        },
    ]
    assert (
        estimate_tokens(_request(messages=messages, params={"max_tokens": 50})) == 5 + 8 + 50
    )  # ceil(17 / 4), images count nothing
    assert (
        estimate_tokens(_request(prompt="abcd", params={"max_completion_tokens": 10, "max_tokens": 99, "n": 3}))
        == 1 + 4 + 30
    )
    assert estimate_tokens(_request(prompt="abcd", params={"max_tokens": "many"})) == 1 + 4 + DEFAULT_COMPLETION_TOKENS


def test_used_tokens_reads_the_usage_of_a_response():
    assert used_tokens({"total_tokens": 42}) == 42
    assert used_tokens({"prompt_tokens": 10, "completion_tokens": 5}) == 15
    assert used_tokens({}) is None and used_tokens(None) is None and used_tokens({"total_tokens": -1}) is None
