"""The systems under measurement and the run that starts them: dlqapp workers (on the
`openai` backend against the mock LLM, or on the simulated backend) and the baselines
(bench/baseline_*.py), each on fresh topics."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.drivers import BENCH_PARTITIONS, make_topics, requests_for, requests_with_plan, wait_results
from bench.harness import MockLLM, Record, Worker, produce, unique, unique_ids
from dlqapp.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
LATENCY_MS = 100
"""Latency of the mocks every section may share (`Bench.mock`, `Bench.mock_failing`)."""
CONCURRENCY = 64
"""Calls in flight of dlqapp and of the baselines, unless a section sets its own."""
BENCH_GUARANTEE = os.environ.get("DLQ_PROCESSING_GUARANTEE") or Settings.from_env({}).processing_guarantee
"""The mode every section runs dlqapp in: the default settings' (exactly_once), unless
DLQ_PROCESSING_GUARANTEE says otherwise. The sections where the mode matters (`lateness`,
`overhead`, `llm_scale`, `guarantee`) measure the other mode beside it in the same run."""
OTHER_GUARANTEE = "at_least_once" if BENCH_GUARANTEE == "exactly_once" else "exactly_once"
"""The mode measured beside BENCH_GUARANTEE where the difference matters."""
WARM_UP_REQUESTS = 2_000
"""Requests a worker of each mode handles before anything is measured (`Bench.warm_up`)."""
BENCH_BEFORE = os.environ.get("BENCH_BEFORE", "")
"""A source tree of an earlier dlqapp (`git worktree add /tmp/before <commit>`): `overhead` and
`llm_scale` run its worker too (`dlqapp_before`, same settings, this tree's harness), so the
cost of a change is a ratio measured side by side in one run."""


@dataclass
class Running:
    """A system under measurement: its process, where its input goes, where its outcomes appear."""

    pid: int
    input: str
    results: list[str]
    """The results topic first, then any other outcome topic (dlqapp's DLQ)."""
    stop: Callable[[], None]
    alive: Callable[[], bool]
    log: Path


def baseline_command(
    script: str, bootstrap: str, settings: Settings, llm: MockLLM, group: str, count: int, *extra: str
) -> list[str]:
    """The command line of a baseline (bench/<script>) from `settings.input` to `settings.results`."""
    return [
        PYTHON,
        str(ROOT / "bench" / script),
        "--bootstrap",
        bootstrap,
        "--input",
        settings.input,
        "--results",
        settings.results,
        "--llm",
        llm.api_url + "/chat/completions",
        "--group",
        group,
        "--count",
        str(count),
        *extra,
    ]


class Bench:
    """One benchmark run: the broker, a scratch directory, the options, and the two mocks
    (at LATENCY_MS, one failing 10% of calls) the sections share; starts the systems."""

    def __init__(
        self, bootstrap: str, tmp: Path, quick: bool, profile_dir: Path | None = None, requests: int = 0, runs: int = 0
    ) -> None:
        self.bootstrap = bootstrap
        self.tmp = tmp
        self.quick = quick
        self.profile_dir = profile_dir
        self.requests = requests
        """Requests per run of `overhead` and `llm_scale` (0: their defaults)."""
        self.runs = runs
        """Runs of `overhead` and `llm_scale` (0: their defaults)."""
        self.mock = MockLLM(tmp, args=["--latency-ms", str(LATENCY_MS)]).start()
        self.mock_failing = MockLLM(
            tmp, args=["--latency-ms", str(LATENCY_MS), "--fail", "503=0.1", "--seed", "5"]
        ).start()

    def close(self) -> None:
        """Stop the shared mocks."""
        self.mock.stop()
        self.mock_failing.stop()

    # -- dlqapp workers ------------------------------------------------------------------

    def worker(self, **env: str) -> Worker:
        """A dlqapp worker with the settings every measurement shares, plus `env`.

        A fixed concurrency, like the baselines': the adaptive limit starts at its floor and
        grows only as calls complete (a measurement that holds calls open would never see
        more than one), and is measured on its own in `flow_control`."""
        return Worker(
            self.bootstrap,
            self.tmp,
            name=unique("bw"),
            env_extra={
                "DLQ_CONCURRENCY": str(CONCURRENCY),
                "DLQ_RETRY_DELAYS": "1s,2s,3s",
                "DLQ_LOG_LEVEL": "warning",
                "DLQ_ADAPTIVE_CONCURRENCY": "false",
                "DLQ_PARTITIONS": str(BENCH_PARTITIONS),
                "DLQ_PROCESSING_GUARANTEE": BENCH_GUARANTEE,
                **env,
            },
        )

    def dlqapp_worker(self, mock: MockLLM, **env: str) -> Worker:
        """A worker on the `openai` backend against the mock."""
        return self.worker(DLQ_INFERENCE="openai", DLQ_INFERENCE_URL=mock.api_url, **env)

    def simulated_worker(self, latency_ms: int, **env: str) -> Worker:
        """A worker on the simulated backend (always succeeds unless a request's plan says otherwise)."""
        simulated = {
            "DLQ_SIMULATED_SUCCESS_RATE": "1.0",
            "DLQ_SIMULATED_LATENCY": f"{latency_ms}ms",
            "DLQ_SIMULATED_JITTER": "0ms",
        }
        return self.worker(**{**simulated, **env})

    def warm_up(self) -> None:
        """Run WARM_UP_REQUESTS through a worker of each mode, one in ten failing once, and
        measure nothing: a broker's JVM compiles its hot paths (transactions, fetches from
        the retry topics) in its first minutes, and the first scenario measured on a fresh
        broker paid for it (idle retries 35-43 ms late at the p99 where later runs of the
        same code were 6-19)."""
        for mode in (BENCH_GUARANTEE, OTHER_GUARANTEE):
            worker = self.simulated_worker(latency_ms=LATENCY_MS, DLQ_PROCESSING_GUARANTEE=mode)
            worker.start()
            try:
                failing = unique_ids("warm-fail", WARM_UP_REQUESTS // 10)
                plain = unique_ids("warm", WARM_UP_REQUESTS - len(failing))
                produce(
                    self.bootstrap, worker.topic("input"), requests_with_plan(failing, fail_times=1, error="unknown")
                )
                produce(self.bootstrap, worker.topic("input"), requests_for(plain))
                wait_results(self.bootstrap, worker.topic("results"), failing + plain, timeout=300)
            finally:
                worker.kill()

    # -- one pass over requests already waiting ------------------------------------------

    def run_baseline(self, script: str, count: int, extra: list[str] | None = None) -> list[Record]:
        """Results of `count` requests through a baseline started on them."""
        prefix = unique("bench") + "."
        settings = make_topics(self.bootstrap, prefix)
        ids = unique_ids("b", count)
        produce(self.bootstrap, settings.input, requests_for(ids))
        args = baseline_command(script, self.bootstrap, settings, self.mock, prefix + "group", count, *(extra or []))
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            return wait_results(self.bootstrap, settings.results, ids, timeout=600)
        finally:
            process.kill()
            process.wait()

    def run_dlqapp(self, count: int, mock: MockLLM) -> list[Record]:
        """Results of `count` requests (a request that fails all attempts ends in the DLQ instead)."""
        worker = self.dlqapp_worker(mock)
        worker.start()
        try:
            ids = unique_ids("d", count)
            produce(self.bootstrap, worker.topic("input"), requests_for(ids))
            outcomes = wait_results(self.bootstrap, [worker.topic("results"), worker.topic("dlq")], ids, timeout=900)
            return [r for r in outcomes if r.topic == worker.topic("results")]
        finally:
            worker.kill()

    # -- ready systems on empty topics ---------------------------------------------------

    def start_baseline_b(self, mock: MockLLM, concurrency: int) -> Running:
        """Baseline B consuming fresh topics, once it has joined its group (input still empty)."""
        return self.start_baseline("baseline_async.py", mock, concurrency)

    def start_baseline_c(self, mock: MockLLM, concurrency: int, http: str = "aiohttp") -> Running:
        """Baseline C (the cheapest Faust pass-through) consuming fresh topics, once it owns
        partitions; `http`: the model's client, `aiohttp` or `dlqapp` (dlqapp's own)."""
        return self.start_baseline("baseline_faust.py", mock, concurrency, "--http", http)

    def start_baseline(self, script: str, mock: MockLLM, concurrency: int, *extra: str) -> Running:
        """bench/<script> on fresh topics (`extra`: more of its arguments), once it prints `ready`."""
        prefix = unique("bench") + "."
        settings = make_topics(self.bootstrap, prefix)
        args = baseline_command(
            script, self.bootstrap, settings, mock, prefix + "group", 10**12, "--concurrency", str(concurrency), *extra
        )
        log = self.tmp / f"{prefix}{script}.log"
        with open(log, "ab") as stderr:
            process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=self.tmp)
        assert process.stdout is not None
        for line in process.stdout:  # Faust's worker prints a banner first
            if line.strip() == "ready":
                break
        else:
            raise AssertionError(f"{script} did not start: {log.read_text(errors='replace')[-2000:]}")

        def stop() -> None:
            process.kill()
            process.wait()

        return Running(process.pid, settings.input, [settings.results], stop, lambda: process.poll() is None, log)

    def start_dlqapp(self, mock: MockLLM, concurrency: int, **env: str) -> Running:
        """A ready dlqapp worker (openai backend against `mock`) with `concurrency` calls in flight."""
        worker = self.dlqapp_worker(mock, DLQ_CONCURRENCY=str(concurrency), **env)
        worker.start()
        assert worker.process is not None
        process = worker.process
        return Running(
            process.pid,
            worker.topic("input"),
            [worker.topic("results"), worker.topic("dlq")],
            worker.kill,
            lambda: process.poll() is None,
            worker.log_path,
        )
