import pytest

from dlqapp.core.errors import (
    DEFAULT_RETRYABLE,
    ErrorClass,
    Failure,
    InferenceError,
    classify_exception,
    is_retryable,
)


@pytest.mark.parametrize(
    "exc, cls",
    [
        (TimeoutError(), ErrorClass.TIMEOUT),
        (ConnectionRefusedError("refused"), ErrorClass.CONNECTION_ERROR),
        (InferenceError(ErrorClass.RATE_LIMITED, "429", 2000), ErrorClass.RATE_LIMITED),
        (ValueError("surprise"), ErrorClass.UNKNOWN),
        (KeyError("x"), ErrorClass.UNKNOWN),
    ],
)
def test_every_exception_maps_to_a_class(exc, cls):
    assert classify_exception(exc).error_class is cls


def test_retry_after_survives_classification():
    assert classify_exception(InferenceError(ErrorClass.RATE_LIMITED, "429", 2000)).retry_after_ms == 2000


def test_default_table_matches_the_brief():
    retryable = {c for c in ErrorClass if is_retryable(Failure(c, ""), DEFAULT_RETRYABLE)}
    assert retryable == {
        ErrorClass.TIMEOUT,
        ErrorClass.CONNECTION_ERROR,
        ErrorClass.SERVER_ERROR,
        ErrorClass.RATE_LIMITED,
        ErrorClass.UNKNOWN,
    }


def test_the_providers_word_overrides_the_table():
    assert is_retryable(Failure(ErrorClass.SERVER_ERROR, "503", retryable=False), DEFAULT_RETRYABLE) is False
    assert is_retryable(Failure(ErrorClass.INVALID_REQUEST, "400", retryable=True), DEFAULT_RETRYABLE) is True
