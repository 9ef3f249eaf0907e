import random

from hypothesis import given
from hypothesis import strategies as st

from dlqapp.core.backoff import Backoff
from dlqapp.retries.keys import decode_parked_key, due_upper_bound, parked_key

due_times = st.integers(min_value=0, max_value=2**63)
request_ids = st.text(min_size=1, max_size=256)


@given(due_times, request_ids, due_times, request_ids)
def test_byte_order_is_due_time_order(due_a, id_a, due_b, id_b):
    if due_a < due_b:
        assert parked_key(due_a, id_a) < parked_key(due_b, id_b)


@given(due_times, request_ids)
def test_keys_round_trip(due, request_id):
    assert decode_parked_key(parked_key(due, request_id)) == (due, request_id)


@given(due_times, request_ids, st.integers(min_value=0, max_value=2**62))
def test_upper_bound_admits_exactly_the_due_keys(due, request_id, now):
    assert (parked_key(due, request_id) < due_upper_bound(now)) == (due <= now)


def test_tier_delays_are_exact():
    backoff = Backoff((1000, 10_000, 60_000))
    assert [backoff.delay_ms(t) for t in range(3)] == [1000, 10_000, 60_000]


def test_retry_after_is_honoured_when_longer_than_the_tier():
    backoff = Backoff((1000, 10_000, 60_000))
    assert backoff.delay_ms(0, retry_after_ms=3000) == 3000
    assert backoff.delay_ms(1, retry_after_ms=3000) == 10_000


def test_exponential_backoff_doubles_within_its_jitter():
    backoff = Backoff((1000, 10_000, 60_000), mode="exponential", jitter=0.2)
    rng = random.Random(7)
    for tier, base in enumerate([1000, 2000, 4000]):
        delays = [backoff.delay_ms(tier, rng=rng) for _ in range(200)]
        assert all(base * 0.8 <= d <= base for d in delays)
        assert len(set(delays)) > 1
