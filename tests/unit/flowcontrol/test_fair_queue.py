"""Weighted fair queuing of waiting events between tenants (dlqapp.flowcontrol.fair)."""

from __future__ import annotations

from dlqapp.flowcontrol.fair import FairQueue


def test_one_tenant_is_first_in_first_out():
    queue: FairQueue[int] = FairQueue()
    for i in range(5):
        queue.put(i, "a", 100)
    assert [queue.take() for _ in range(5)] == [0, 1, 2, 3, 4] and len(queue) == 0


def test_a_tenant_arriving_behind_a_flood_is_served_within_a_round():
    queue: FairQueue[str] = FairQueue()
    for i in range(1000):
        queue.put(f"a{i}", "a", 100)
    for _ in range(10):
        queue.take()
    queue.put("b0", "b", 100)
    taken = [queue.take() for _ in range(3)]
    assert "b0" in taken  # not after the 990 still waiting


def test_weights_share_what_is_taken():
    queue: FairQueue[str] = FairQueue(weight_of=lambda tenant: 3.0 if tenant == "gold" else 1.0)
    for _ in range(400):
        queue.put("gold", "gold", 100)
        queue.put("tin", "tin", 100)
    taken = [queue.take() for _ in range(400)]
    assert 290 <= taken.count("gold") <= 310  # three to one


def test_tokens_not_counts_share_it():
    queue: FairQueue[str] = FairQueue()
    for _ in range(400):
        queue.put("big", "big", 1000)
        queue.put("small", "small", 100)
    taken = [queue.take() for _ in range(220)]
    assert taken.count("small") >= 9 * taken.count("big") - 10


def test_drain_gives_every_item_back():
    queue: FairQueue[int] = FairQueue()
    for i in range(6):
        queue.put(i, "a" if i % 2 else "b", 1)
    assert sorted(queue.drain()) == list(range(6)) and len(queue) == 0
