"""The dashboard in a real headless browser: Debian's chromium, driven by Playwright.

While three requests share a long prefix, the page must draw the pool, mark the shared
blocks as shared, list the requests with their shared blocks, and show a block's token
text on hover. A screenshot is saved (its path is printed). Skipped only where chromium
is missing outside CI; in CI (CI=true) a missing browser fails the test.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.api.dashboard_load import QUESTIONS, shared_prefix_streams

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("CI") != "true":
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)",
                allow_module_level=True)


def test_page_draws_shared_blocks_and_requests(server, tmp_path):
    assert CHROMIUM is not None, "CI must install chromium (see .ci/run)"
    from playwright.sync_api import sync_playwright

    with shared_prefix_streams(server.url), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{server.url}/dashboard")
            num_blocks = server.engine.core.allocator.num_blocks
            page.wait_for_function(
                "n => document.querySelectorAll('#pool .block').length === n - 1",
                arg=num_blocks, timeout=30_000)
            # Every running request shares blocks, and the grid marks them as shared.
            page.wait_for_function(
                """k => {
                  const rows = [...document.querySelectorAll('#requests tr.request.running')];
                  const sharing = rows.filter(
                    r => +r.querySelector('.shared-count').textContent > 0);
                  return sharing.length === k
                    && document.querySelectorAll('#pool .block.shared').length > 0;
                }""", arg=len(QUESTIONS), timeout=30_000)
            shared = page.locator("#pool .block.shared")
            refs = shared.evaluate_all("cells => cells.map(c => +c.dataset.ref)")
            counts = page.locator("#requests tr.request .shared-count").all_inner_texts()
            print(f"{len(refs)} blocks drawn as shared, ref counts {refs}; "
                  f"shared blocks per request {counts}")
            assert refs and all(ref == len(QUESTIONS) for ref in refs)
            assert len(counts) == len(QUESTIONS) and all(int(c) == len(refs) for c in counts)
            # A shared block's tooltip shows its tokens and place in the hash chain.
            shared.nth(1).hover()
            tooltip = page.locator("#tooltip")
            tooltip.filter(has_text="ref count").wait_for(timeout=10_000)
            text = tooltip.inner_text()
            print("tooltip:", text)
            assert f"ref count {len(QUESTIONS)}" in text and "hash chain: block #1" in text
            assert "library" in text or "tokens 16" in text
            page.wait_for_timeout(3000)  # let the counter charts gather a few points
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            print("screenshot:", shot)
            assert shot.stat().st_size > 10_000
            assert not errors, errors
        finally:
            browser.close()
