# dlqapp: the two set-up commands, and a few more.
.PHONY: run test unit lint chaos interop bench venv kafka-start kafka-stop clean

run:            ## Kafka + one worker (simulated backend) in the foreground; Ctrl-C stops both
	@scripts/run

TEST_WORKERS ?= 2
test:           ## make lint, then the whole suite (TEST_WORKERS test files at a time); starts (and stops) its own Kafka unless KAFKA_BOOTSTRAP is set
	@scripts/test -n $(TEST_WORKERS) --dist loadgroup

chaos:          ## the full-size chaos suite (100k requests, kill -9, broker restart, 3 workers, a 3-broker cluster) and 50 random histories (tests/history)
	@CHAOS_FULL=1 CHAOS_REPORT=$(CURDIR)/chaos-report.jsonl scripts/test tests/chaos tests/history -s

interop:        ## the whole gateway interop group (a real LiteLLM proxy, Kafka's console tools)
	@INTEROP_FULL=1 scripts/test tests/interop

bench:          ## benchmarks side by side with the baselines (about 60 min); writes bench/results/
	@scripts/venv test && .venv/bin/python bench/run.py

unit:           ## make lint, then only the fast unit tests (no broker)
	@scripts/lint && .venv/bin/python -m pytest tests/unit -q

lint:           ## the static checks: ruff format --check, ruff check, mypy (venv's pinned versions; config in pyproject.toml)
	@scripts/lint

venv:
	@scripts/venv test

kafka-start:
	@scripts/kafka-local start

kafka-stop:
	@scripts/kafka-local stop

clean:
	rm -rf .venv .kafka-data dlqapp-data .pytest_cache
