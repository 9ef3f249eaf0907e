"""Reaching the other workers: the owner of a request id, a command on its worker, and
reads fanned out to every worker and merged."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import aiohttp
from faust import web
from yarl import URL

from dlqapp.api.http import ApiError
from dlqapp.core.commands import Command, ReplayStatus
from dlqapp.deadletters.entries import owner_id

ASK_TIMEOUT_S = 30.0
FANOUT_TIMEOUT_S = 10.0
ROUTE_TIMEOUT_S = 10.0


def owner_url(hosts: dict[str, dict[str, list[int]]], partition: int) -> str | None:
    """The worker (URL) whose active partitions of a table include `partition`, from a
    table's assignment (`app.router.table_metadata`: URL -> {changelog topic: partitions})."""
    for url, topics in hosts.items():
        if any(partition in partitions for partitions in topics.values()):
            return url
    return None


class Cluster:
    """This worker's way to the others, found from the group's assignment of the DLQ table."""

    def __init__(self, app: Any, owner: Callable[[str], int], *, operator_agent: Any, table_name: str) -> None:
        self.app = app
        self.owner = owner
        self.operator_agent = operator_agent
        self.table_name = table_name

    async def routed(self, view: web.View, request: web.Request, table_name: str, key: str) -> web.Response | None:
        """The owning worker's answer for `key`, or None when this worker owns it.

        The owner is found by dlqapp's own partitioning of the request id (the partition its
        state was written to) and the group's current assignment; not by Faust's router, which
        hashes the key with the producer's topic metadata: that metadata loses every topic but
        the newest one each time the producer first sends to a topic created since its last
        full refresh (an `ask()` reply topic), and routing then failed with a TypeError.
        """
        partition = self.owner(owner_id(key))
        url = owner_url(self.app.router.table_metadata(table_name), partition)
        if url is None:
            raise ApiError(503, f"no worker owns partition {partition} of {table_name} now (a rebalance?); try again")
        if self._is_self(url):
            return None
        target = URL(url).with_path(request.rel_url.path).with_query(request.rel_url.query)
        try:
            async with self.app.http_client.request(
                request.method, target, headers=request.headers, timeout=aiohttp.ClientTimeout(total=ROUTE_TIMEOUT_S)
            ) as response:
                return view.text(await response.text(), content_type=response.content_type, status=response.status)
        except Exception as exc:  # the owner is unreachable (stopping, or mid-rebalance)
            raise ApiError(503, f"the worker owning {key!r} did not answer ({type(exc).__name__}); try again") from None

    async def ask(self, command: Command) -> dict[str, Any]:
        """Run a command on the worker owning its request id and return its answer."""
        partition = self.owner(owner_id(command.request_id))
        try:
            return await asyncio.wait_for(
                self.operator_agent.ask(value=command.to_dict(), key=command.request_id.encode(), partition=partition),
                ASK_TIMEOUT_S,
            )
        except TimeoutError:
            return {
                "request_id": command.request_id,
                "status": ReplayStatus.ERROR,
                "reason": f"no answer within {ASK_TIMEOUT_S:.0f}s (is a rebalance running?)",
            }

    def _is_self(self, url: str) -> bool:
        return url.rstrip("/") == str(self.app.conf.canonical_url).rstrip("/")

    async def fan_out(self, local: Callable[[], Any], path: str, params: Any) -> tuple[list[dict[str, Any]], list[str]]:
        """This worker's answer plus every other worker's answer to `path` (local routes).

        `local()` may return the answer or an awaitable of it; `params` is a dict or (name, value) pairs."""
        hosts = [h for h in self.app.router.table_metadata(self.table_name) if not self._is_self(h)]
        mine = local()
        answers = [await mine if inspect.isawaitable(mine) else mine]
        errors: list[str] = []

        async def remote(host: str) -> None:
            url = f"{str(host).rstrip('/')}{path}"
            try:
                async with self.app.http_client.get(
                    url, params=params, timeout=aiohttp.ClientTimeout(total=FANOUT_TIMEOUT_S)
                ) as response:
                    response.raise_for_status()
                    answers.append(await response.json())
            except Exception as exc:  # one unreachable worker must not hide the others
                errors.append(f"{host}: {type(exc).__name__}: {exc}")

        await asyncio.gather(*(remote(h) for h in hosts))
        return answers, errors

    async def merged(
        self, local: Callable[[], Any], path: str, params: Any, merge: Callable[[list[dict[str, Any]]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Every worker's answer to `path` merged by `merge`; `incomplete` names the workers that did not answer."""
        answers, errors = await self.fan_out(local, path, params)
        merged = merge(answers)
        if errors:
            merged["incomplete"] = errors
        return merged
