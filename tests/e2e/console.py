"""Shared by the Chromium tests: the browser, screenshots, layout checks."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support import ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(os.environ.get("DLQ_SCREENSHOTS_DIR") or ROOT / "build" / "screenshots")
"""Where the tests save PNGs of the console's main states (docs/operations.md: Admin page)."""

SCRIPT_PAYLOAD = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def off_loop(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call `fn` in a thread of its own: Playwright's sync API keeps an event loop running in
    this one, and helpers such as `produce` start their own with asyncio.run()."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page PNG as SCREENSHOTS/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


CLIPPED = """() => {
  const problems = [];
  if (document.documentElement.scrollWidth > window.innerWidth + 1) {
    const wide = [...document.querySelectorAll('body *')]
      .filter((n) => n.getBoundingClientRect().right > window.innerWidth + 1);
    problems.push('page scrolls sideways: ' + document.documentElement.scrollWidth + ' px, past the edge: ' +
      wide.slice(0, 5).map((n) => n.tagName + '#' + n.id + '.' + n.className).join(', '));
  }
  for (const node of document.querySelectorAll('body *')) {
    if (!node.offsetParent && getComputedStyle(node).position !== 'fixed') continue;
    const style = getComputedStyle(node);
    if (['auto', 'scroll'].includes(style.overflowX) && node.scrollWidth > node.clientWidth + 1) {
      problems.push('scrollbar on ' + (node.id || node.className || node.tagName));
    }
  }
  const cells = 'td.keep, #rows td:last-child, #r-rows td:last-child, #r-rows td.due, #workers td.num';
  for (const cell of document.querySelectorAll(cells)) {
    if (cell.scrollWidth > cell.clientWidth + 1) problems.push('clipped: ' + cell.textContent);
  }
  return problems;
}"""
"""Why the page does not fit: sideways scrolling, scrollbars, clipped cells that must show in full."""
