"""Interop fixtures: a real LiteLLM proxy (installed on first use) in front of dlqapp-mock-llm.

Cases marked `interop_full` run only with INTEROP_FULL=1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.interop.gateway import (
    InstallError,
    LiteLLMProxy,
    config,
    installed_version,
    litellm_venv,
)
from tests.support import MockLLM


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "interop_full: long interop case, run only with INTEROP_FULL=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("INTEROP_FULL") == "1":
        return
    skip = pytest.mark.skip(reason="long interop case: set INTEROP_FULL=1 to run it")
    for item in items:
        if "interop_full" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def litellm_env():
    """The LiteLLM virtualenv, or a skip saying why it could not be installed."""
    try:
        return litellm_venv()
    except InstallError as exc:
        pytest.skip(f"LiteLLM could not be installed: {exc}")


@pytest.fixture(scope="session")
def litellm_version(litellm_env) -> str:
    return installed_version(litellm_env)


@pytest.fixture(scope="session")
def upstream(tmp_path_factory) -> Iterator[MockLLM]:
    """dlqapp-mock-llm as the provider behind LiteLLM's `upstream` model."""
    mock = MockLLM(tmp_path_factory.mktemp("upstream"), args=["--latency-ms", "5"]).start()
    yield mock
    mock.stop()


@pytest.fixture(scope="session")
def litellm(litellm_env, upstream, tmp_path_factory) -> Iterator[LiteLLMProxy]:
    """One LiteLLM proxy for the session (tests that kill a proxy start their own)."""
    proxy = LiteLLMProxy(litellm_env, tmp_path_factory.mktemp("litellm"), config(upstream.api_url)).start()
    yield proxy
    proxy.kill()
