"""Weighted fair queuing among tenants inside the backend slot limiter (dlqapp.flowcontrol.slots)."""

from __future__ import annotations

import asyncio

from dlqapp.flowcontrol.slots import DUE, NORMAL, SlotLimiter


async def _serve(limiter: SlotLimiter, arrivals: list[tuple[str, int, float]]) -> list[str]:
    """One slot; every arrival waits behind a blocker; returns the tenants in the order served."""
    order: list[str] = []
    hold = asyncio.Event()

    async def user(tenant: str, priority: int, cost: float, wait: asyncio.Event | None = None) -> None:
        async with limiter.slot(priority, tenant, cost):
            order.append(tenant)
            if wait is not None:
                await wait.wait()

    blocker = asyncio.create_task(user("blocker", NORMAL, 1.0, hold))
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(user(t, p, c)) for t, p, c in arrivals]
    await asyncio.sleep(0)
    hold.set()
    await asyncio.gather(blocker, *tasks)
    return order[1:]


def test_a_late_tenant_is_served_within_a_round_not_after_the_flood():
    flood = [("A", NORMAL, 100.0)] * 50
    order = asyncio.run(_serve(SlotLimiter(1), [*flood, ("B", NORMAL, 100.0)]))
    assert order.index("B") <= 1  # FIFO would have served it 51st


def test_shares_follow_the_weights_in_tokens():
    arrivals = [("A", NORMAL, 100.0)] * 40 + [("B", NORMAL, 100.0)] * 40
    order = asyncio.run(_serve(SlotLimiter(1, weights={"A": 3.0}), arrivals))
    first = order[:20]
    assert first.count("A") == 15 and first.count("B") == 5


def test_shares_are_counted_in_tokens_not_calls():
    arrivals = [("big", NORMAL, 1000.0)] * 10 + [("small", NORMAL, 100.0)] * 50
    order = asyncio.run(_serve(SlotLimiter(1), arrivals))
    assert order[:22].count("small") >= 18  # ten small calls cost what one big one does


def test_one_tenant_is_first_come_first_served_and_due_retries_still_go_first():
    order = asyncio.run(
        _serve(SlotLimiter(1), [("A", NORMAL, 5.0), ("A", NORMAL, 1.0), ("B", DUE, 50.0), ("A", NORMAL, 9.0)])
    )
    assert order == ["B", "A", "A", "A"]


def test_waiting_by_tenant_is_reported():
    async def run() -> dict[str, dict[str, float]]:
        limiter = SlotLimiter(1, weights={"A": 2.0})
        hold = asyncio.Event()

        async def user(tenant: str) -> None:
            async with limiter.slot(NORMAL, tenant, 10):
                await hold.wait()

        tasks = [asyncio.create_task(user(t)) for t in ("A", "A", "B", "C")]
        await asyncio.sleep(0)
        snapshot = limiter.tenants_snapshot()
        hold.set()
        await asyncio.gather(*tasks)
        return snapshot

    snapshot = asyncio.run(run())
    assert snapshot["A"] == {"waiting": 1, "weight": 2.0}
    assert snapshot["B"]["waiting"] == 1 and snapshot["C"]["waiting"] == 1
