"""A fake of aiokafka's transactional producer, for the exactly-once unit tests."""

from __future__ import annotations

import asyncio


class FakeProducer:
    """Records each transaction's records; `visible` holds the committed ones only."""

    def __init__(self, transactional_id: str = "app-0", fail_send: bool = False, fail_commit: bool = False) -> None:
        self.transactional_id = transactional_id
        self.fail_send, self.fail_commit = fail_send, fail_commit
        self.fail_begin = False
        self.open: list[tuple[str, bytes | None]] | None = None
        self.visible: list[tuple[str, bytes | None]] = []
        self.open_keyed: list[tuple[str, bytes | None, bytes | None]] = []
        self.visible_keyed: list[tuple[str, bytes | None, bytes | None]] = []
        """(topic, key, value) of the open transaction and of the committed ones."""
        self.refuse: dict[str, BaseException] = {}
        """Topic → the error the broker answers a record of it with (its send's future fails)."""
        self.started = self.stopped = False
        self.commits = 0
        self.aborts = 0
        self.answer = asyncio.Event()
        """The broker's answer to EndTxn (cleared: a commit waits for it)."""
        self.answer.set()

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def begin_transaction(self) -> None:
        assert self.open is None, "a transaction is open already"
        if self.fail_begin:
            raise RuntimeError("ProducerFenced")
        self.open = []

    async def abort_transaction(self) -> None:
        self.open = None
        self.open_keyed = []
        self.aborts += 1

    async def commit_transaction(self) -> None:
        if self.fail_commit:
            raise RuntimeError("ProducerFenced")
        await self.answer.wait()
        assert not self.stopped, "the producer was stopped under a commit: its answer never comes"
        assert self.open is not None
        self.visible += self.open
        self.visible_keyed += self.open_keyed
        self.open, self.open_keyed = None, []
        self.commits += 1

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: object = None,
    ) -> asyncio.Future[None]:
        if self.open is None:
            raise ValueError("Can't send messages while not in transaction")  # aiokafka's IllegalOperation
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail_send:
            done.set_exception(RuntimeError("NotEnoughReplicas"))
        elif topic in self.refuse:
            done.set_exception(self.refuse[topic])
        else:
            self.open.append((topic, value))
            self.open_keyed.append((topic, key, value))
            done.set_result(None)
        return done
