"""The web page of `harness serve` in a real browser: headless Chromium driven by Selenium, against
the app served by uvicorn on a free loopback port with the faux provider scripting the replies.

The server runs in a thread of its own (its own event loop), so the browser's blocking calls never
hold it up; `Page.run` runs a coroutine there. Skipped,
with the reason, only when Chromium or its driver is not installed (`apt-get install chromium
chromium-driver`; CI installs them).

`HARNESS_PAGE_SCREENSHOT=docs/serve.png` also saves the README's screenshot of the page.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from drive_helpers import ProbeTool
from harness.context import Context
from harness.providers.faux import FauxReply, reply, tool_call
from harness.server import Approvals, StoreTokens
from harness.session import connect
from server_helpers import USER, Served, asgi_client, faux_app, serving

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="the browser tests need Chromium and chromedriver (apt-get install chromium chromium-driver)")

if CHROMIUM is not None and CHROMEDRIVER is not None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement
    from selenium.webdriver.support.wait import WebDriverWait

WAIT_S = 10.0
"""How long a test waits for the page to show something before it fails."""

T = TypeVar("T")


@dataclass
class Page:
    """The app served on its own loop in a thread, over a SQLite store in `directory`, answering
    `script` with the faux provider; `write` is a tool that needs approval. With `tokens` the
    server checks bearer tokens and `token` is one of `USER`'s; else every request is `USER`."""

    directory: Path
    script: list[FauxReply | str]
    tokens: bool = False
    url: str = ""
    token: str = ""
    served: Served = field(init=False)
    write: ProbeTool = field(default_factory=lambda: ProbeTool("write"))
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        ready: Future[str] = Future()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(ready),), daemon=True)
        self._thread.start()
        self.url = ready.result(timeout=WAIT_S)

    async def _serve(self, ready: Future[str]) -> None:
        context = Context({"test": "page"})
        store = await connect(f"sqlite:///{self.directory}/harness.db", context)
        try:
            auth = None
            if self.tokens:
                auth = StoreTokens(store.tokens)
                self.token, _ = await store.tokens.create(USER, context)
            self.served = faux_app(store, self.script, auth=auth, tools=[self.write], approvals=Approvals())
            async with serving(self.served.app) as url:
                ready.set_result(url)
                await self._stop.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error)
            raise
        finally:
            await store.close()

    def run(self, coroutine: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine(), self._loop).result(timeout=WAIT_S)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=WAIT_S)
        self._loop.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or ""
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,860"):
        options.add_argument(flag)
    with tempfile.TemporaryDirectory() as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER or ""), options=options)
        try:
            yield driver
        finally:
            driver.quit()


@pytest.fixture
def browser_tab(browser: WebDriver) -> Iterator[WebDriver]:
    """The browser with one tab, closed again after the test (the test may open more)."""
    yield browser
    for handle in browser.window_handles[1:]:
        browser.switch_to.window(handle)
        browser.close()
    browser.switch_to.window(browser.window_handles[0])
    browser.get("about:blank")


@contextmanager
def served(tmp_path: Path, *script: FauxReply | str, tokens: bool = False) -> Iterator[Page]:
    """The page's server answering `script`, stopped on leaving."""
    page = Page(tmp_path, list(script), tokens=tokens)
    page.start()
    try:
        yield page
    finally:
        page.stop()


def wait(driver: WebDriver, condition: Callable[[WebDriver], T | None]) -> T:
    """What `condition` returns once it is truthy; fails after `WAIT_S`."""
    result = WebDriverWait(driver, WAIT_S).until(condition)
    assert result is not None
    return result


def shown(driver: WebDriver, css: str, text: str) -> WebElement:
    """The first element matching `css` whose text contains `text`, once the page shows it."""
    def find(d: WebDriver) -> WebElement | None:
        return next((e for e in d.find_elements(By.CSS_SELECTOR, css) if text in e.text), None)
    return wait(driver, find)


def rows(driver: WebDriver) -> list[str]:
    """The transcript's rows as text, top to bottom."""
    return [row.text for row in driver.find_elements(By.CSS_SELECTOR, "#transcript > .row")]


def open_new_conversation(driver: WebDriver, page: Page) -> str:
    driver.get(page.url)
    driver.find_element(By.ID, "new-conversation").click()
    wait(driver, lambda d: "?c=" in d.current_url)
    return driver.current_url


def say(driver: WebDriver, text: str) -> None:
    driver.find_element(By.ID, "prompt").send_keys(text, Keys.ENTER)


def running(driver: WebDriver) -> bool:
    return driver.find_element(By.ID, "stop").is_displayed()


def idle(driver: WebDriver) -> bool:
    return not running(driver) and not driver.find_elements(By.CSS_SELECTOR, "[data-live]")


# -- the tests ----------------------------------------------------------------------------------------


async def test_the_page_is_served_at_the_root_and_every_api_route_wins(tmp_path: Path, ctx: Context) -> None:
    """`/` is the page and its modules are served beside it; an unknown API path is still the
    API's JSON 404, never a file."""
    store = await connect(f"sqlite:///{tmp_path}/harness.db", ctx)
    try:
        async with asgi_client(faux_app(store).app) as client:
            index = await client.get("/")
            module = await client.get("/app.js")
            missing = await client.get("/api/nothing-here")
    finally:
        await store.close()

    assert index.status_code == 200
    assert index.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/app.js">' in index.text
    assert module.status_code == 200
    assert "javascript" in module.headers["content-type"]
    assert missing.status_code == 404
    assert missing.json()["code"] == "not_found"


def test_a_new_conversation_is_listed_and_opened(tmp_path: Path, browser_tab: WebDriver) -> None:
    """New conversation creates one over the API, lists it as the current one and opens its
    (empty) view; a reload opens the same one from the address."""
    with served(tmp_path) as page:
        address = open_new_conversation(browser_tab, page)
        browser_tab.refresh()

        current = wait(browser_tab, lambda d: d.find_elements(By.CSS_SELECTOR, '#conversations a[aria-current="page"]'))
        assert address.endswith(current[0].get_attribute("data-id") or "?")
        assert browser_tab.find_element(By.ID, "conversation").is_displayed()
        assert rows(browser_tab) == []


def test_a_server_with_tokens_asks_for_one_until_it_is_valid(tmp_path: Path, browser_tab: WebDriver) -> None:
    """Behind bearer tokens the page asks for one; a wrong one is asked again, a valid one lists
    the token's user's conversations and is sent with every request after."""
    with served(tmp_path, tokens=True) as page:
        mine = page.run(lambda: page.served.service.create(USER, page.served.app.state.server.new_lane(None),
                                                           Context({"test": "page"}), name="mine"))
        browser_tab.get(page.url)  # a port of its own: an origin with no token stored

        for token in ("not-a-token", page.token):
            field_ = wait(browser_tab, lambda d: d.find_element(By.ID, "token") if
                          d.find_element(By.ID, "sign-in").get_attribute("open") is not None else None)
            field_.clear()
            field_.send_keys(token, Keys.ENTER)

        listed = shown(browser_tab, "#conversations a", "mine")
        assert listed.get_attribute("data-id") == mine.id
        assert browser_tab.find_element(By.ID, "sign-in").get_attribute("open") is None


def test_a_call_waiting_for_approval_is_approved_on_the_page_and_the_turn_finishes(
        tmp_path: Path, browser_tab: WebDriver) -> None:
    """The turn's stream ends where the call waits (the AI SDK protocol's pause); the page keeps
    the row with its buttons, Approve answers the call, and the page follows the rest of the turn
    to its reply."""
    with served(tmp_path, reply(tool_call("write", {"key": "a"})), "Written.") as page:
        open_new_conversation(browser_tab, page)
        say(browser_tab, "write it")
        asking = shown(browser_tab, ".row.tool", "needs your approval")
        asking.find_element(By.CSS_SELECTOR, "button.approve").click()

        shown(browser_tab, ".row.assistant", "Written.")
        wait(browser_tab, idle)
        assert page.write.runs == [{"key": "a"}]
        tools = browser_tab.find_elements(By.CSS_SELECTOR, "#transcript > .row.tool")
        assert [(tool.get_attribute("data-state"), tool.find_element(By.CSS_SELECTOR, ".output").text)
                for tool in tools] == [("done", "write:a")]
