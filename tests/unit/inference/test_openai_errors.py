import email.utils

import pytest

from dlqapp.core.errors import ErrorClass
from dlqapp.inference.openai_errors import classify_response, retry_after_ms

NOW = 1_800_000_000.0


def error(code="", message=""):
    return {"error": {"code": code, "message": message, "type": "x"}}


@pytest.mark.parametrize(
    "status, body, cls",
    [
        (500, error(), ErrorClass.SERVER_ERROR),
        (502, error(), ErrorClass.SERVER_ERROR),
        (503, error(), ErrorClass.SERVER_ERROR),
        (529, error(), ErrorClass.SERVER_ERROR),
        (408, error(), ErrorClass.SERVER_ERROR),
        (409, error(), ErrorClass.SERVER_ERROR),
        (429, error("rate_limit_exceeded"), ErrorClass.RATE_LIMITED),
        (429, error("insufficient_quota", "You exceeded your current quota"), ErrorClass.QUOTA_EXCEEDED),
        (
            400,
            error("context_length_exceeded", "This model's maximum context length is 8192 tokens"),
            ErrorClass.CONTEXT_LENGTH,
        ),
        (
            400,
            error("", "Please reduce the length of the messages: maximum context length exceeded"),
            ErrorClass.CONTEXT_LENGTH,
        ),
        (
            400,
            error("content_filter", "The response was filtered due to the prompt triggering content management policy"),
            ErrorClass.CONTENT_FILTER,
        ),
        (400, error("invalid_value", "temperature must be <= 2"), ErrorClass.INVALID_REQUEST),
        (422, error(), ErrorClass.INVALID_REQUEST),
        (401, error("invalid_api_key"), ErrorClass.AUTH_ERROR),
        (403, error(), ErrorClass.AUTH_ERROR),
        (404, error("model_not_found"), ErrorClass.INVALID_REQUEST),
        (418, "teapot", ErrorClass.UNKNOWN),
    ],
)
def test_status_and_body_map_to_a_class(status, body, cls):
    assert classify_response(status, {}, body=body).error_class is cls


def test_retry_after_header_forms():
    assert retry_after_ms({"retry-after-ms": "1500"}) == 1500
    assert retry_after_ms({"Retry-After": "3"}) == 3000
    assert retry_after_ms({"retry-after": "0.25"}) == 250
    date = email.utils.formatdate(NOW + 4, usegmt=True)
    assert 3000 <= retry_after_ms({"retry-after": date}, now=NOW) <= 4000
    assert retry_after_ms({"retry-after": "soon"}) is None
    assert retry_after_ms({}) is None
    assert retry_after_ms({"retry-after-ms": "800", "retry-after": "9"}) == 800  # the precise one wins


def test_rate_limit_carries_its_delay():
    failure = classify_response(429, {"retry-after": "2"}, body=error("rate_limit_exceeded"))
    assert failure.retry_after_ms == 2000 and "429" in failure.message


def test_x_should_retry_overrides():
    assert classify_response(503, {"x-should-retry": "false"}, body=error()).retryable is False
    assert classify_response(400, {"x-should-retry": "true"}, body=error()).retryable is True
    assert classify_response(503, {}, body=error()).retryable is None


def test_litellm_context_window_exceeded_is_context_length():
    """Issue 20: LiteLLM's ContextWindowExceededError was read as invalid_request."""
    body = {
        "error": {
            "message": (
                "litellm.ContextWindowExceededError: litellm.BadRequestError: "
                "this is a mock context window exceeded error"
            ),
            "type": "invalid_request_error",
            "code": "400",
        }
    }
    assert classify_response(400, {}, body=body).error_class is ErrorClass.CONTEXT_LENGTH


def test_retry_after_on_an_overloaded_server_is_kept():
    failure = classify_response(503, {"retry-after": "4"}, body=error("", "overloaded"))
    assert failure.error_class is ErrorClass.SERVER_ERROR and failure.retry_after_ms == 4000
    assert classify_response(400, {"retry-after": "4"}, body=error()).retry_after_ms is None  # not retried: no delay
