"""Run histories by hand, on a broker of their own:

    .venv/bin/python -m tests.history --seed 7                 # one random history
    .venv/bin/python -m tests.history --seed 1 --count 5       # seeds 1..5
    .venv/bin/python -m tests.history --named case1            # a named one (case1, case2, case3)
    .venv/bin/python -m tests.history --replay build/histories/x.json
    .venv/bin/python -m tests.history --seed 7 --shrink-runs 5 # shrink a failure

Prints each history's report line, its violations and where it saved what it collected.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.history.check import check_all
from tests.history.generate import NAMED, History, generate
from tests.history.run import ProxiedKafka
from tests.history.shrink import Outcome, play, report_line, shrink, write_failure


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.history")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int)
    which.add_argument("--named", choices=sorted(NAMED))
    which.add_argument("--replay", type=Path)
    parser.add_argument("--count", type=int, default=1, help="with --seed: this many seeds from it")
    parser.add_argument("--size", choices=("small", "large"), default="small")
    parser.add_argument("--shrink-runs", type=int, default=0)
    parser.add_argument("--shrink-budget", type=float, default=600.0)
    parser.add_argument("--print", action="store_true", help="print the history(ies) and stop")
    args = parser.parse_args()

    if args.named:
        histories = [NAMED[args.named]()]
    elif args.replay:
        histories = [History.from_json(args.replay.read_text())]
    else:
        histories = [generate(seed, args.size) for seed in range(args.seed, args.seed + args.count)]
    if args.print:
        for history in histories:
            print(history.describe())
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="dlqapp-history-"))
    kafka = ProxiedKafka(tmp).start()
    failed = 0
    try:
        for n, history in enumerate(histories):
            print(history.describe(), flush=True)
            outcome = play(history, kafka, tmp / f"h{n}")
            report_line(outcome)
            if outcome.failed:
                failed += 1
                shrunk = None
                if args.shrink_runs:

                    def rerun(smaller: History, i: int, n: int = n) -> Outcome:
                        return play(smaller, kafka, tmp / f"h{n}-shrink{i}")

                    shrunk = shrink(outcome, rerun, args.shrink_budget, args.shrink_runs)
                print(write_failure(outcome, shrunk), flush=True)
            else:
                assert not check_all(outcome.collected)
    finally:
        kafka.stop()
    print(f"{len(histories) - failed} of {len(histories)} histories passed; work dir {tmp}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
