"""The dashboard at GET /admin in a real headless browser: Debian's chromium (installed by
.ci/run) driven by Playwright, against the real service on the default model. It renders
the live model and a request count that grows after a request; its unload and load
buttons change the model's state as /admin/status shows it; it asks for the admin key
once when one is set. A screenshot is saved as a test artifact (its path is printed)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.integration.service import REPO, Service

pytestmark = pytest.mark.timeout(600)

CHROMIUM = os.environ.get("MLXD_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# no network of its own, no first-run or background chatter: the page only talks to the service
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO / ".cache" / "artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the test extra's playwright is not installed")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page
    finally:
        context.close()
    assert not errors, f"the page's script failed: {errors}"


def status_of(service: Service, model: str, headers: dict[str, str] | None = None) -> str:
    body = httpx.get(f"{service.base_url}/admin/status", headers=headers, timeout=10).json()
    return next(m["state"] for m in body["models"] if m["id"] == model)


def wait_for(probe: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def save_screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / name)
    print(f"dashboard screenshot: {path} (and {ARTIFACTS / name})")
    return path


def test_the_dashboard_shows_the_live_model_and_its_buttons_work(service: Service, model_id: str, page: Any,
                                                                  tmp_path: Path) -> None:
    page.goto(f"{service.base_url}/admin")
    row = page.locator(f'tr[data-model="{model_id}"]')
    state = row.locator("[data-state]")
    state.wait_for()
    page.wait_for_function("document.querySelector('#request-count').textContent.trim() !== '-'")
    assert state.text_content() in ("idle", "ready")
    assert page.locator("#version").text_content()  # the top panel came from /admin/status
    served = int(page.locator("#request-count").text_content())

    client = OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Say hello."}],
                                   max_tokens=8, temperature=0)
    page.wait_for_function(f"Number(document.querySelector('#request-count').textContent) > {served}",
                           timeout=15_000)

    row.locator('button[data-action="unload"]').click()
    wait_for(lambda: status_of(service, model_id) == "unloaded", "the unload, as /admin/status shows")
    page.wait_for_function(f"""document.querySelector('tr[data-model="{model_id}"] [data-state]')
                               .dataset.state === 'unloaded'""", timeout=15_000)
    assert row.locator('button[data-action="unload"]').is_disabled()

    row.locator('button[data-action="load"]').click()
    wait_for(lambda: status_of(service, model_id) in ("idle", "ready"), "the load, as /admin/status shows", 300)
    page.wait_for_function(f"""['idle', 'ready'].includes(document.querySelector(
                               'tr[data-model="{model_id}"] [data-state]').dataset.state)""", timeout=15_000)
    assert "failed" not in (page.locator("#action-result").text_content() or "")
    save_screenshot(page, tmp_path, "dashboard.png")


def test_the_dashboard_asks_for_the_admin_key_once(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                                                    page: Any, tmp_path: Path) -> None:
    admin_key = "sk-dashboard-admin"
    svc = Service(["--model", str(default_model_dir), "--admin-key", admin_key], home=tmp_path_factory.mktemp("home"))
    try:
        svc.wait_ready()
        model = httpx.get(f"{svc.base_url}/v1/models", headers={"Authorization": f"Bearer {admin_key}"}).json()
        model_id = model["data"][0]["id"]
        page.goto(f"{svc.base_url}/admin")  # the page itself needs no key
        page.locator("#key-panel").wait_for(state="visible")
        page.fill("#key-input", "sk-wrong")
        page.click("#key-form button")
        page.wait_for_function("document.querySelector('#key-error').textContent.includes('refused')")
        page.fill("#key-input", admin_key)
        page.click("#key-form button")
        page.locator(f'tr[data-model="{model_id}"] [data-state]').wait_for()
        assert page.locator("#key-panel").is_hidden()
        assert page.evaluate("sessionStorage.getItem('mlxd.adminKey')") == admin_key
        page.reload()  # kept for the tab: not asked again
        page.locator(f'tr[data-model="{model_id}"] [data-state]').wait_for()
        assert page.locator("#key-panel").is_hidden()
        # the buttons send the key too
        page.locator(f'tr[data-model="{model_id}"] button[data-action="pin"]').click()
        headers = {"Authorization": f"Bearer {admin_key}"}
        wait_for(lambda: next(m["pinned"] for m in httpx.get(f"{svc.base_url}/admin/status", headers=headers)
                              .json()["models"] if m["id"] == model_id), "the pin")
        save_screenshot(page, tmp_path, "dashboard-with-key.png")
    finally:
        svc.stop()
