"""What the in-flight window's and the gated feed's tests share: an event that records its
ack, and an error route that re-raises."""


class FakeEvent:
    def __init__(self, offset, acked):
        self.offset, self._acked = offset, acked

    def ack(self):
        self._acked.append(self.offset)
        return True


async def _reraise(event, exc):
    raise exc
