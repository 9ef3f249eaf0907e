"""Chromium for the admin page tests: one browser per module, a fresh page per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.console import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def new_page(browser) -> Iterator[Callable[..., Any]]:
    """`new_page(width=1280, height=900)`: a page in its own context; all closed after the test."""
    contexts: list[Any] = []

    def make(width: int = 1280, height: int = 900) -> Any:
        context = browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(20_000)
        return page

    yield make
    for context in contexts:
        context.close()


@pytest.fixture
def page(new_page) -> Any:
    return new_page()
