"""The web page of `harness serve` in a real browser (issue 16 item 7): headless Chromium driven by
Selenium, against the app served by uvicorn on a free loopback port with the faux provider scripting
the replies, a reply paused mid-way (`delay`) where a test acts mid-reply: send and see the reply
stream, approve a call and deny one, stop a run, reload mid-reply, two tabs following one turn, the
model picker, a delegated job's row, a fallback's and a budget stop's rows.

The server runs in a thread of its own (its own event loop), so the browser's blocking calls never
hold it up; `Page.run` runs a coroutine there and `Page.release` lets a paused reply go on. Skipped,
with the reason, only when Chromium or its driver is not installed (`apt-get install chromium
chromium-driver`; CI installs them).

`HARNESS_PAGE_SCREENSHOTS=docs` also saves the README's pictures of the page, each where a test
reaches its state (scripts/page_screenshots.sh).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import struct
import tempfile
import threading
import zlib
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pydantic import JsonValue
from rich.text import Text

from drive_helpers import FAUX, ProbeTool
from harness.cli.chat_rows import chat_row
from harness.context import Context
from harness.conversation import GENERAL_AGENT, AgentRegistry, Budget, ChatEventDetails, EventRow, run_typed_command
from harness.errors import HarnessError
from harness.garden import Garden, Gardener, GardenSetup
from harness.imports.plan import ImportPlan, write_plan
from harness.messages import (
    AssistantMessage,
    Cost,
    ImageContent,
    ModelIdentity,
    TextContent,
    Usage,
    UserMessage,
)
from harness.providers import Model
from harness.providers.faux import (
    FauxDelay,
    FauxReply,
    FauxRequest,
    FauxScript,
    delay,
    failure,
    reply,
    thinking,
    tool_call,
)
from harness.runtime import DriveSettings, RetryPolicy
from harness.server import Approvals, StoreTokens
from harness.session import LaneConfig, MessagePayload, Store, connect
from server_helpers import USER, Served, asgi_client, faux_app, serving

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="the browser tests need Chromium and chromedriver (apt-get install chromium chromium-driver)")

if CHROMIUM is not None and CHROMEDRIVER is not None:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.wait import WebDriverWait

WAIT_S = 10.0
"""How long a test waits for the page to show something before it fails."""

POLL_S = 0.1
"""How often a test looks again while it waits (WebDriver's default, half a second, is most of
a page test's time)."""

T = TypeVar("T")


@dataclass
class Page:
    """The app served on its own loop in a thread, over a SQLite store in `directory`, answering
    `script` with the faux provider; `write` and `edit` are tools whose calls wait for an answer
    from the page, `agents` the sub-agents the model may delegate to and `models` those the registry holds
    beside the faux one. With `tokens` the server checks bearer tokens and `token` is one of
    `USER`'s; else every request is `USER`. `drive` and `projects_file` as `faux_app`'s."""

    directory: Path
    script: FauxScript
    tokens: bool = False
    agents: AgentRegistry | None = None
    models: Sequence[Model] = ()
    drive: DriveSettings | None = None
    projects_file: Path | None = None
    url: str = ""
    token: str = ""
    served: Served = field(init=False)
    write: ProbeTool = field(default_factory=lambda: ProbeTool("write", asks_first=True))
    edit: ProbeTool = field(default_factory=lambda: ProbeTool("edit", asks_first=True))
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
            self.served = faux_app(store, self.script, auth=auth, tools=[self.write, self.edit], approvals=Approvals(),
                                   agents=self.agents, models=self.models, drive=self.drive,
                                   projects_file=self.projects_file)
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

    def reached(self, pause: FauxDelay) -> None:
        """Return once the reply streamed up to `pause`."""
        self.run(lambda: asyncio.wait_for(pause.reached.wait(), WAIT_S))

    def release(self, pause: FauxDelay) -> None:
        """Let the reply paused at `pause` go on."""
        assert pause.until is not None
        self._loop.call_soon_threadsafe(pause.until.set)

    def conversation(self, config: LaneConfig, name: str | None = None) -> str:
        """A new conversation of `USER` with `config`, made on the server; its id."""
        created = self.run(lambda: self.served.service.create(USER, config, Context({"test": "page"}), name=name))
        return created.id

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
def served(tmp_path: Path, *script: FauxReply | str, tokens: bool = False, agents: AgentRegistry | None = None,
           answer: Callable[[FauxRequest], FauxReply | str] | None = None,
           models: Sequence[Model] = (), drive: DriveSettings | None = None,
           projects_file: Path | None = None) -> Iterator[Page]:
    """The page's server answering `script` (or every request with `answer`), stopped on leaving."""
    page = Page(tmp_path, answer or list(script), tokens=tokens, agents=agents, models=models, drive=drive,
                projects_file=projects_file)
    page.start()
    try:
        yield page
    finally:
        page.stop()


def wait(driver: WebDriver, condition: Callable[[WebDriver], T | None]) -> T:
    """What `condition` returns once it is truthy; fails after `WAIT_S`. A row the page redrew
    while `condition` read it is read again."""
    result = WebDriverWait(driver, WAIT_S, poll_frequency=POLL_S,
                           ignored_exceptions=(StaleElementReferenceException,)).until(condition)
    assert result is not None
    return result


def shown(driver: WebDriver, css: str, text: str) -> WebElement:
    """The first element matching `css` whose text contains `text`, once the page shows it."""
    def find(d: WebDriver) -> WebElement | None:
        return next((e for e in d.find_elements(By.CSS_SELECTOR, css) if text in e.text), None)
    return wait(driver, find)


def rows(driver: WebDriver) -> list[str]:
    """The transcript's rows as text, top to bottom; read again when the page redrew a row between
    finding it and reading it (the journal's rows replace the live ones as a turn ends)."""
    def read(d: WebDriver) -> tuple[list[str]]:  # a tuple, so that no rows is a result too
        return ([row.text for row in d.find_elements(By.CSS_SELECTOR, "#transcript > .row")],)
    return wait(driver, read)[0]


def open_new_conversation(driver: WebDriver, page: Page) -> str:
    driver.get(page.url)
    driver.find_element(By.ID, "new-conversation").click()
    wait(driver, lambda d: "?c=" in d.current_url)
    return driver.current_url


def say(driver: WebDriver, text: str) -> None:
    """Type `text` and Enter into the composer, once the conversation's view shows it."""
    wait(driver, lambda d: d.find_element(By.ID, "prompt")).send_keys(text, Keys.ENTER)


def running(driver: WebDriver) -> bool:
    return driver.find_element(By.ID, "stop").is_displayed()


def idle(driver: WebDriver) -> bool:
    return not running(driver) and not driver.find_elements(By.CSS_SELECTOR, "[data-live]")


def png(width: int, height: int) -> bytes:
    """A grey PNG image of `width` x `height` pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


SCREENSHOTS = os.environ.get("HARNESS_PAGE_SCREENSHOTS")
"""A folder to save the README's pictures of the page in (scripts/page_screenshots.sh); none: none."""


def picture(driver: WebDriver, name: str) -> None:
    """Save the page as the picture `name` when `SCREENSHOTS` names a folder."""
    if SCREENSHOTS:
        driver.save_screenshot(str(Path(SCREENSHOTS) / f"{name}.png"))


# -- the tests ----------------------------------------------------------------------------------------


async def test_the_page_is_served_at_the_root_and_every_api_route_wins(tmp_path: Path, ctx: Context) -> None:
    """`/` is the page and its modules are served beside it; an unknown API path is still the
    API's JSON 404, never a file."""
    store = await connect(f"sqlite:///{tmp_path}/harness.db", ctx)
    try:
        async with asgi_client(faux_app(store).app) as client:
            index = await client.get("/")
            module = await client.get("/assets/index.js")
            missing = await client.get("/api/nothing-here")
    finally:
        await store.close()

    assert index.status_code == 200
    assert index.headers["content-type"].startswith("text/html")
    assert '<script type="module" crossorigin src="/assets/index.js">' in index.text
    assert module.status_code == 200
    assert "javascript" in module.headers["content-type"]
    assert missing.status_code == 404
    assert missing.json()["code"] == "not_found"


async def test_a_messages_images_and_the_conversations_spending_are_read_back(tmp_path: Path, ctx: Context) -> None:
    """What the page reads besides the display: image N of a person's message, with the media
    type its bytes say (`image_not_found` for an index past them, a reply's entry or another
    user's conversation), and the usage ledger summed in tokens and dollars."""
    shot = png(2, 2)
    spent = Usage(input=10, output=5, total_tokens=15, cost=Cost(input=0.001, output=0.0005, total=0.0015))
    store = await connect(f"sqlite:///{tmp_path}/harness.db", ctx)
    try:
        served = faux_app(store, [reply("One.", usage=spent), reply("Two.", usage=spent)])
        async with asgi_client(served.app) as client:
            conversation_id = (await client.post("/api/conversations", json={})).json()["id"]
            conversation = await served.service.open(USER, conversation_id, ctx)
            await conversation.send("look", ctx, images=[ImageContent(data=base64.b64encode(shot).decode(),
                                                                      mime_type="image/jpeg")])
            await conversation.send("again", ctx)
            rows = (await client.get(f"/api/conversations/{conversation_id}/display")).json()["rows"]
            user, reply_ = rows[0], rows[1]
            of = f"/api/conversations/{conversation_id}/messages"
            image = await client.get(f"{of}/{user['id']}/images/0")
            past = await client.get(f"{of}/{user['id']}/images/1")
            of_reply = await client.get(f"{of}/{reply_['id']}/images/0")
            usage = (await client.get(f"/api/conversations/{conversation_id}/usage")).json()
            other = await served.service.create("someone-else", LaneConfig(model=FAUX), ctx)
            elsewhere = await client.get(f"/api/conversations/{other.id}/messages/{user['id']}/images/0")
    finally:
        await store.close()

    assert user["image_count"] == 1
    assert image.status_code == 200
    assert image.content == shot
    assert image.headers["content-type"] == "image/png"  # what the bytes say, not what was claimed
    assert [past.status_code, past.json()["code"]] == [404, "image_not_found"]
    assert [of_reply.status_code, of_reply.json()["code"]] == [404, "image_not_found"]
    assert elsewhere.status_code == 404
    assert usage["total_tokens"] == 30
    assert usage["input"] == 20
    assert usage["cost"]["total"] == pytest.approx(0.003)


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
        shown(browser_tab, "#transcript .empty", "Ask anything")
        picture(browser_tab, "page-empty")


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


def paused(before: str, after: str) -> tuple[FauxReply, FauxDelay]:
    """A reply that streams the text block `before`, waits until released, then streams the text
    block `after`; and its pause."""
    pause = delay(asyncio.Event())
    return FauxReply(parts=(*reply(before).parts, pause, *reply(after).parts)), pause


def mid_reply(driver: WebDriver, page: Page, prompt: str, pause: FauxDelay, so_far: str) -> str:
    """Open a new conversation and send `prompt`; return once its reply, paused at `pause`, shows
    `so_far`. The conversation's address."""
    address = open_new_conversation(driver, page)
    say(driver, prompt)
    page.reached(pause)
    shown(driver, "#transcript .assistant", so_far)
    return address


def tool_state(driver: WebDriver, tool_call_id: str) -> str | None:
    found = driver.find_elements(By.CSS_SELECTOR, f'#transcript .tool[data-id="{tool_call_id}"]')
    return found[0].get_attribute("data-state") if found else None


def test_a_sent_message_streams_its_reply_into_one_row(tmp_path: Path, browser_tab: WebDriver) -> None:
    """The person's message shows at once; the reply streams into one row while Stop is offered,
    and the journal's rows replace the live ones when the turn ends, nothing twice."""
    answer, pause = paused("Hello", "there.")
    with served(tmp_path, answer) as page:
        mid_reply(browser_tab, page, "hi", pause, "Hello")

        assert running(browser_tab)
        picture(browser_tab, "page-streaming")
        page.release(pause)

        shown(browser_tab, "#transcript .assistant", "there.")
        wait(browser_tab, idle)
        assert rows(browser_tab) == ["hi", "Hello there."]  # two text blocks, one Markdown paragraph


def test_a_call_is_approved_and_another_denied_from_the_page(tmp_path: Path, browser_tab: WebDriver) -> None:
    """A `write` call waits with Approve and Deny on its row: approved it runs and the turn goes on;
    denied it never runs and the model reads the refusal. A shell row recorded between turns shows
    at once."""
    script = [reply(thinking("The person wants notes kept."), "I'll write that down. ",
                    tool_call("write", {"key": "notes.txt"}, id="call-a")),
              reply("Written to notes.txt."),
              reply(tool_call("write", {"key": "secrets.txt"}, id="call-b")),
              reply("Understood: I won't write it.")]
    with served(tmp_path, *script) as page:
        open_new_conversation(browser_tab, page)

        say(browser_tab, "Keep a note of the plan")
        shown(browser_tab, '#transcript .tool[data-id="call-a"] button.approve', "Approve").click()
        shown(browser_tab, "#transcript .assistant", "Written to notes.txt.")
        wait(browser_tab, idle)
        say(browser_tab, "Now write the secrets")
        shown(browser_tab, '#transcript .tool[data-id="call-b"] button.deny', "Deny").click()
        shown(browser_tab, "#transcript .assistant", "I won't write it.")
        wait(browser_tab, idle)
        conversation_id = browser_tab.current_url.split("?c=")[1]
        page.run(lambda: page.served.service.record_local_shell(USER, conversation_id, "ls", 0, "notes.txt\n",
                                                                Context({"test": "page"})))
        shown(browser_tab, "#transcript .event", "! ls · exit 0")

        assert page.write.runs == [{"key": "notes.txt"}]
        assert tool_state(browser_tab, "call-a") == "done"
        assert tool_state(browser_tab, "call-b") == "failed"
        assert "blocked" in browser_tab.find_element(By.CSS_SELECTOR, '.tool[data-id="call-b"] .output').text
        assert not browser_tab.find_elements(By.CSS_SELECTOR, "#transcript .approval")
        assert not browser_tab.find_element(By.CSS_SELECTOR, "#transcript .thinking").get_attribute("open")
        picture(browser_tab, "serve")


EDIT: dict[str, JsonValue] = {"key": "greeting", "path": "src/greet.py",
                              "old_text": "def greet(name):\n    print('helo', name)\n",
                              "new_text": "def greet(name: str) -> None:\n    print('hello', name)\n"}
"""An `edit` call's arguments: the page shows them as the diff the terminal shows."""


def test_an_edit_waiting_for_approval_shows_its_diff(tmp_path: Path, browser_tab: WebDriver) -> None:
    """An `edit` call that waits for approval shows the change it would make as a highlighted
    diff, open, with Approve and Deny, as the terminal shows it; approved, it runs."""
    script = [reply("The greeting has a typo; I'll fix it and add types. ", tool_call("edit", EDIT, id="call-e")),
              reply("Fixed: `greet` now says **hello**.")]
    with served(tmp_path, *script) as page:
        open_new_conversation(browser_tab, page)
        say(browser_tab, "Fix the typo in src/greet.py")
        card = shown(browser_tab, '#transcript .tool[data-id="call-e"][data-state="approval"]', "needs your approval")
        diff = card.find_element(By.CSS_SELECTOR, "details[open] pre code")
        lines = diff.text.split("\n")
        assert "-    print('helo', name)" in lines
        assert "+    print('hello', name)" in lines
        assert card.find_element(By.CSS_SELECTOR, ".path").text == "src/greet.py"
        picture(browser_tab, "page-approval")

        card.find_element(By.CSS_SELECTOR, "button.approve").click()
        shown(browser_tab, "#transcript .assistant", "Fixed:")
        wait(browser_tab, idle)
        assert page.edit.runs == [EDIT]


@pytest.mark.parametrize("how", ["button", "esc"])
def test_stop_stops_the_run_with_one_interrupted_row(tmp_path: Path, browser_tab: WebDriver, how: str) -> None:
    """Stop mid-reply (the Stop button, or Esc) is the durable stop: the run ends, the reply keeps
    what it wrote and the stop is one row, the interrupted row, not also the reply's error (the
    request was aborted); the composer takes a new message."""
    answer, pause = paused("Partial", "never shown")
    with served(tmp_path, answer) as page:
        mid_reply(browser_tab, page, "go", pause, "Partial")

        if how == "esc":
            browser_tab.find_element(By.ID, "prompt").send_keys(Keys.ESCAPE)
        else:
            browser_tab.find_element(By.ID, "stop").click()

        shown(browser_tab, "#transcript .event", "interrupted by you")
        wait(browser_tab, idle)
        assert "never shown" not in " ".join(rows(browser_tab))
        assert rows(browser_tab) == ["go", "Partial", "■ interrupted by you"]
        assert browser_tab.find_element(By.ID, "send").text == "Send"


def test_a_reload_mid_reply_shows_the_same_transcript_once(tmp_path: Path, browser_tab: WebDriver) -> None:
    """Reloaded mid-reply, the page reads the display and resumes the turn from its start: the
    reply so far once, then the rest live, nothing twice."""
    answer, pause = paused("First half.", "second half.")
    with served(tmp_path, answer) as page:
        mid_reply(browser_tab, page, "hi", pause, "First half.")

        browser_tab.refresh()

        shown(browser_tab, "#transcript .assistant", "First half.")
        wait(browser_tab, running)
        assert rows(browser_tab) == ["hi", "First half."]
        page.release(pause)
        shown(browser_tab, "#transcript .assistant", "second half.")
        wait(browser_tab, idle)
        assert rows(browser_tab) == ["hi", "First half. second half."]


def test_a_second_tab_opened_mid_turn_follows_it_live(tmp_path: Path, browser_tab: WebDriver) -> None:
    """A tab opened after the turn started sees it so far and then live, as the tab that sent it
    does; both end with the same rows."""
    answer, pause = paused("Working on it.", "Done now.")
    with served(tmp_path, answer) as page:
        address = open_new_conversation(browser_tab, page)
        first = browser_tab.current_window_handle
        say(browser_tab, "start")
        page.reached(pause)

        browser_tab.switch_to.new_window("tab")
        browser_tab.get(address)
        shown(browser_tab, "#transcript .assistant", "Working on it.")
        wait(browser_tab, running)
        page.release(pause)

        shown(browser_tab, "#transcript .assistant", "Done now.")
        wait(browser_tab, idle)
        second_rows = rows(browser_tab)
        browser_tab.switch_to.window(first)
        wait(browser_tab, idle)
        assert rows(browser_tab) == second_rows == ["start", "Working on it. Done now."]


def test_the_model_picker_lists_the_models_and_follows_a_switch(tmp_path: Path, browser_tab: WebDriver) -> None:
    """The picker lists the server's models with the conversation's current one chosen; a pick
    switches it, with the model row, and a reload shows the switched one."""
    with served(tmp_path, reply("Hi.")) as page:
        open_new_conversation(browser_tab, page)
        say(browser_tab, "hi")
        shown(browser_tab, "#transcript .assistant", "Hi.")
        wait(browser_tab, idle)
        picker = browser_tab.find_element(By.ID, "model")
        values = [o.get_attribute("value") or "" for o in picker.find_elements(By.TAG_NAME, "option")]
        assert picker.get_attribute("value") == "faux/faux"
        other = next(value for value in values if value != "faux/faux")

        Select(picker).select_by_value(other)

        shown(browser_tab, "#transcript .event", f"model: faux/faux → {other}")
        browser_tab.refresh()
        wait(browser_tab, lambda d: d.find_element(By.ID, "model").get_attribute("data-current") == other)
        assert len(values) == 2  # the faux model and the embedded one, always in a registry


KEY_ENV = "HARNESS_PAGE_TEST_KEY"
KEYED = Model(id="keyed", provider="faux", api="faux", name="Scripted model with a key", api_key_env=KEY_ENV)
"""A model of the faux provider that needs `KEY_ENV` set: a switch to it fails while the key is unset."""
OTHER = Model(id="other", provider="faux", api="faux", name="Another scripted model")
"""A second model of the faux provider: the turns after a switch to it are scripted too."""


def picked(driver: WebDriver) -> tuple[str, str, str]:
    """The picker as the person sees it: (the model shown, the model in force, the state line)."""
    picker = driver.find_element(By.ID, "model")
    return (picker.get_attribute("value") or "", picker.get_attribute("data-current") or "",
            driver.find_element(By.ID, "model-state").text)


def test_a_queued_switch_that_fails_puts_the_picker_back_and_says_so(
        tmp_path: Path, browser_tab: WebDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """CE-12 (issue 28): a pick made while a turn runs is acknowledged as queued; when it fails as
    it applies after the turn (its key was withdrawn meanwhile), the server records an error row
    with a model-switch-failed notice, and the page shows that row, puts the picker back on the
    model in force, clears the state line and shows the failure."""
    monkeypatch.setenv(KEY_ENV, "a key")
    answer, pause = paused("Working.", "Done.")
    with served(tmp_path, answer, models=[KEYED]) as page:
        open_new_conversation(browser_tab, page)
        say(browser_tab, "go")
        page.reached(pause)

        Select(browser_tab.find_element(By.ID, "model")).select_by_value("faux/keyed")
        wait(browser_tab, lambda d: picked(d) == ("faux/keyed", "faux/faux", "switches when the turn ends"))
        monkeypatch.delenv(KEY_ENV)
        page.release(pause)

        shown(browser_tab, '#transcript .event[data-kind="error"]', "✗ could not switch the model to faux/keyed")
        wait(browser_tab, lambda d: picked(d) == ("faux/faux", "faux/faux", ""))
        error = browser_tab.find_element(By.ID, "error")
        assert error.is_displayed()
        assert error.text == "✗ could not switch the model to faux/keyed"
        assert error.get_attribute("data-code") == "model-switch-failed"


# Put before the page's own scripts: the watch's requests go through it, so a test can cut the watch
# (`watched.cut()`), make its retry resume from an older event id (`watched.rewind`) and read what
# each connection carried (`watched.streams`, one text per connection).
WATCH_TAP = """
const watched = { rewind: null, cut: () => {}, streams: [] };
window.watched = watched;
const fetchAnything = window.fetch;
window.fetch = async (path, init = {}) => {
  if (!String(path).endsWith("/events")) return fetchAnything(path, init);
  const cut = new AbortController();
  init.signal?.addEventListener("abort", () => cut.abort());
  watched.cut = () => cut.abort();
  const headers = { ...init.headers };
  if (watched.rewind != null) {
    headers["Last-Event-ID"] = watched.rewind;
    watched.rewind = null;
  }
  const response = await fetchAnything(path, { ...init, headers, signal: cut.signal });
  const [tapped, body] = response.body.tee();
  const reader = tapped.pipeThrough(new TextDecoderStream()).getReader();
  const stream = watched.streams.push("") - 1;
  (async () => {
    for (let read = await reader.read(); !read.done; read = await reader.read()) watched.streams[stream] += read.value;
  })().catch(() => {});
  return new Response(body, response);
};
"""


@contextmanager
def watch_tapped(driver: WebDriver) -> Iterator[None]:
    """`WATCH_TAP` in every page the tab loads, while inside."""
    script = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_TAP})
    try:
        yield
    finally:
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})


def event_id_of(stream: str, row_id: str) -> str:
    """The `id:` of the watch's `chat_event` that carries the row `row_id` in the SSE text `stream`."""
    [event] = [block for block in stream.split("\n\n")
               if "event: chat_event" in block and f'"id":"{row_id}"' in block.replace(" ", "")]
    return next(line[3:].strip() for line in event.splitlines() if line.startswith("id:"))


def test_a_watch_that_replays_an_old_model_row_does_not_undo_a_newer_pick(
        tmp_path: Path, browser_tab: WebDriver) -> None:
    """CE-12 (issue 28), retries ignore previously observed event ids: a switch landed (its model
    row reconciled the picker), then a pick made while a turn runs waits; the watch is cut and
    resumes from before the landed row, so the server sends that row again. The picker keeps the
    waiting pick and its state line, and follows the pick when it lands."""
    answer, pause = paused("Working.", "Done.")
    other = "faux/other"
    with watch_tapped(browser_tab), served(tmp_path, reply("Hi."), answer, models=[OTHER]) as page:
        open_new_conversation(browser_tab, page)
        say(browser_tab, "hi")
        shown(browser_tab, "#transcript .assistant", "Hi.")
        wait(browser_tab, idle)
        picker = browser_tab.find_element(By.ID, "model")
        Select(picker).select_by_value(other)
        landed = shown(browser_tab, '#transcript .event[data-kind="model"]', f"model: faux/faux → {other}")
        landed_id = landed.get_attribute("data-id") or ""
        say(browser_tab, "go")
        page.reached(pause)
        Select(picker).select_by_value("faux/faux")
        waiting = ("faux/faux", other, "switches when the turn ends")
        wait(browser_tab, lambda d: picked(d) == waiting)

        [stream] = browser_tab.execute_script("return watched.streams")
        seq = int(event_id_of(stream, landed_id).split(".")[0])
        browser_tab.execute_script("watched.rewind = arguments[0]; watched.cut()", str(seq - 1))
        wait(browser_tab, lambda d: landed_id in d.execute_script("return watched.streams[1] ?? ''"))
        # The page reads each chunk in the task that received it: the next task sees what it did.
        assert browser_tab.execute_async_script("setTimeout(arguments[0], 0)") is None
        assert picked(browser_tab) == waiting

        page.release(pause)
        shown(browser_tab, '#transcript .event[data-kind="model"]', f"model: {other} → faux/faux")
        wait(browser_tab, lambda d: picked(d) == ("faux/faux", "faux/faux", ""))


def test_a_background_jobs_result_is_a_delegation_row(tmp_path: Path, browser_tab: WebDriver) -> None:
    """A job delegated in the background shows, where its result reached the conversation, as a
    delegation row worded from its finish marker (CE-18)."""
    parent = [reply(tool_call("delegate", {"agent": "general", "task": "Find the bug\nin parser.py",
                                           "background": True})),
              reply("It runs in the background.")]

    def answer(request: FauxRequest) -> FauxReply | str:
        if GENERAL_AGENT.instructions in (request.request.system_prompt or ""):
            return "Fixed the bug."
        return parent.pop(0)

    with served(tmp_path, answer=answer, agents=AgentRegistry([GENERAL_AGENT])) as page:
        conversation_id = page.conversation(LaneConfig(model=FAUX, active_tools=["delegate"]))
        browser_tab.get(f"{page.url}/?c={conversation_id}")
        say(browser_tab, "find the bug")

        row = shown(browser_tab, "#transcript .delegation", "⇢ agent general finished: Find the bug")
        assert row.get_attribute("data-tone") == "quiet"
        wait(browser_tab, idle)


def test_a_fallback_and_a_budget_stop_show_their_rows(tmp_path: Path, browser_tab: WebDriver) -> None:
    """The model fails with a retryable error past its retries: the fallback model takes the step,
    its model row saying so and why; the conversation's cap of 1 token then stops the run before
    the step after its call, with the budget row (issue 32)."""
    drive = DriveSettings(frame_interval_s=0, retry=RetryPolicy(max_retries=0),
                          fallback=(ModelIdentity(provider="faux", model_id=OTHER.id),))
    with served(tmp_path, failure("retryable", "overloaded"), reply(tool_call("nothing")), models=[OTHER],
                drive=drive) as page:
        conversation_id = page.conversation(LaneConfig(model=FAUX))
        page.run(lambda: page.served.service.set_budget(USER, conversation_id, Budget(conversation_tokens=1),
                                                        Context({"test": "page"})))
        browser_tab.get(f"{page.url}/?c={conversation_id}")
        say(browser_tab, "go")

        shown(browser_tab, '#transcript .event[data-kind="model"]',
              "model: faux/faux → faux/other (fallback: overloaded)")
        budget = shown(browser_tab, '#transcript .event[data-kind="budget"]',
                       "■ stopped: the conversation reached its budget of 1 tokens")
        assert budget.get_attribute("data-tone") == "warn"
        assert budget.text.endswith("tokens used)")
        wait(browser_tab, idle)


# -- what a person expects of a chat page (issue 31) ---------------------------------------------------


MARKDOWN = ("**Done** with `list`:\n\n- one\n- two\n\n```python\nprint('hi')\n```\n\n"
            "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\">")


def test_a_reply_renders_as_markdown_with_highlighted_code_and_inert_html(
        tmp_path: Path, browser_tab: WebDriver) -> None:
    """A reply's Markdown renders (bold, a list, a fenced block highlighted, with a copy button),
    never its raw syntax; a `<script>` or an `<img onerror>` in it runs nothing."""
    with served(tmp_path, reply(MARKDOWN)) as page:
        open_new_conversation(browser_tab, page)
        say(browser_tab, "list them")
        wait(browser_tab, idle)

        reply_row = shown(browser_tab, "#transcript .assistant", "Done")
        assert reply_row.find_element(By.TAG_NAME, "strong").text == "Done"
        assert [item.text for item in reply_row.find_elements(By.TAG_NAME, "li")] == ["one", "two"]
        code = wait(browser_tab, lambda d: d.find_elements(By.CSS_SELECTOR,
                                                           "#transcript .assistant pre code span[style]"))
        assert "print" in " ".join(span.text for span in code)
        assert reply_row.find_elements(By.CSS_SELECTOR, "button[title*='Copy'], button[aria-label*='Copy']")
        assert "**" not in reply_row.text
        assert "```" not in reply_row.text
        assert browser_tab.execute_script("return window.pwned ?? null") is None
        assert not reply_row.find_elements(By.CSS_SELECTOR, "script, img[onerror]")


def listed(driver: WebDriver) -> list[str]:
    """The conversation list's names, top to bottom."""
    def read(d: WebDriver) -> tuple[list[str]]:
        return ([link.find_element(By.CSS_SELECTOR, ".name").text
                 for link in d.find_elements(By.CSS_SELECTOR, "#conversations a")],)
    return wait(driver, read)[0]


def test_a_conversation_is_named_from_its_first_prompt_renamed_and_deleted(
        tmp_path: Path, browser_tab: WebDriver) -> None:
    """The first prompt names the conversation (its first line, as the terminal does) in the list
    and the title, with the time it was written; Rename names it anew with its row; Delete, once
    confirmed, removes it from the list and the store."""
    with served(tmp_path, reply("Sure."), reply("Renamed.")) as page:
        address = open_new_conversation(browser_tab, page)
        conversation_id = address.split("?c=")[1]
        say(browser_tab, "Plan the trip\nwith details")
        wait(browser_tab, lambda d: listed(d) == ["Plan the trip"])
        assert browser_tab.find_element(By.ID, "title").text == "Plan the trip"
        assert browser_tab.find_element(By.CSS_SELECTOR, "#conversations a time").text

        item = browser_tab.find_element(By.CSS_SELECTOR, "#conversations li")
        hover = ActionChains(browser_tab).move_to_element(item)
        hover.perform()
        browser_tab.find_element(By.CSS_SELECTOR, "#conversations .rename-button").click()
        field_ = wait(browser_tab, lambda d: d.find_element(By.CSS_SELECTOR, "#conversations input.rename"))
        field_.send_keys(Keys.CONTROL, "a")
        field_.send_keys("Trip to Lisbon", Keys.ENTER)
        wait(browser_tab, lambda d: listed(d) == ["Trip to Lisbon"])
        shown(browser_tab, "#transcript .event", "renamed: Trip to Lisbon")

        hover.perform()
        browser_tab.find_element(By.CSS_SELECTOR, "#conversations .delete-button").click()
        wait(browser_tab, lambda d: d.switch_to.alert).accept()
        wait(browser_tab, lambda d: listed(d) == [])
        infos = page.run(lambda: page.served.service.list(USER, Context({"test": "page"})))
        assert conversation_id not in [info.id for info in infos]


def test_call_ids_a_provider_reuses_keep_each_card_in_its_turn(tmp_path: Path, browser_tab: WebDriver) -> None:
    """A provider that names every turn's call `call_1`: each turn's card stays in its place, with
    its own input, live and from the journal."""
    script = [reply(tool_call("write", {"key": "first.txt"}, id="call_1")),
              reply("Wrote the first. ", tool_call("write", {"key": "second.txt"}, id="call_1")),
              reply("Both written.")]
    with served(tmp_path, *script) as page:
        open_new_conversation(browser_tab, page)
        say(browser_tab, "write two files")
        shown(browser_tab, '#transcript .tool[data-state="approval"] button.approve', "Approve").click()
        shown(browser_tab, "#transcript .assistant", "Wrote the first.")
        shown(browser_tab, '#transcript .tool[data-state="approval"] button.approve', "Approve").click()
        shown(browser_tab, "#transcript .assistant", "Both written.")

        def cards(d: WebDriver) -> tuple[list[str]]:
            return ([card.get_attribute("data-state") or "" for card in
                     d.find_elements(By.CSS_SELECTOR, '#transcript .tool[data-id="call_1"]')],)
        wait(browser_tab, idle)
        assert wait(browser_tab, cards)[0] == ["done", "done"]
        texts = rows(browser_tab)
        assert [row.split("\n")[0] for row in texts] == ["write two files", "write", "Wrote the first.", "write",
                                                          "Both written."]
        assert page.write.runs == [{"key": "first.txt"}, {"key": "second.txt"}]


def test_at_390_px_the_page_fits_and_the_list_is_a_drawer(tmp_path: Path, browser_tab: WebDriver) -> None:
    """On a phone-sized window the page has no horizontal scroll; the conversation list is a drawer
    the menu button opens, and a conversation picked in it opens."""
    browser_tab.set_window_size(390, 844)
    try:
        with served(tmp_path, reply("A reply with a long line: " + "word " * 60)) as page:
            browser_tab.get(page.url)
            wait(browser_tab, lambda d: d.find_element(By.ID, "start")).click()
            say(browser_tab, "hi")
            wait(browser_tab, idle)
            overflow = "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
            assert browser_tab.execute_script(overflow) <= 0
            picture(browser_tab, "page-narrow")
            link = browser_tab.find_element(By.CSS_SELECTOR, "#conversations a")
            assert link.location["x"] + link.size["width"] <= 0  # the drawer is closed

            browser_tab.find_element(By.ID, "menu").click()
            wait(browser_tab, lambda d: d.find_element(By.CSS_SELECTOR, "#conversations a").location["x"] >= 0)
            browser_tab.find_element(By.CSS_SELECTOR, "#conversations a").click()
            wait(browser_tab, lambda d: d.find_element(By.ID, "page").get_attribute("data-drawer") == "closed")
            assert browser_tab.execute_script(overflow) <= 0
    finally:
        browser_tab.set_window_size(1280, 860)


def test_the_header_shows_the_connection_and_what_the_conversation_spent(
        tmp_path: Path, browser_tab: WebDriver) -> None:
    """The header says the page is connected, offline while the browser has no network and
    connected again after, reconnecting once the server is gone and offline when it stays gone;
    and what the conversation spent, in tokens and dollars, as the terminal's status line says
    it, read again when a turn ends."""
    spent = Usage(input=1_000, output=234, total_tokens=1_234, cost=Cost(input=0.01, output=0.0023, total=0.0123))
    with served(tmp_path, reply("Counted.", usage=spent)) as page:
        open_new_conversation(browser_tab, page)
        connection = shown(browser_tab, "#connection", "connected")
        assert connection.get_attribute("data-state") == "connected"
        assert shown(browser_tab, "#usage", "0 tokens").text == "0 tokens · $0.0000"

        say(browser_tab, "count")
        shown(browser_tab, "#usage", "1,234 tokens · $0.0123")

        assert isinstance(browser_tab, webdriver.Chrome)
        browser_tab.set_network_conditions(offline=True, latency=0, download_throughput=-1, upload_throughput=-1)
        try:
            shown(browser_tab, '#connection[data-state="offline"]', "offline")
        finally:
            browser_tab.delete_network_conditions()
        shown(browser_tab, '#connection[data-state="connected"]', "connected")

    shown(browser_tab, '#connection[data-state="reconnecting"]', "reconnecting…")  # the server stopped
    shown(browser_tab, '#connection[data-state="offline"]', "offline")


ATTACH_JS = """
const [how, base64, name] = arguments;
const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
const data = new DataTransfer();
data.items.add(new File([bytes], name, {type: "image/png"}));
if (how === "paste") {
  document.getElementById("prompt").dispatchEvent(
    new ClipboardEvent("paste", {clipboardData: data, bubbles: true, cancelable: true}));
} else {
  document.getElementById("transcript").dispatchEvent(
    new DragEvent("drop", {dataTransfer: data, bubbles: true, cancelable: true}));
}
"""
"""Paste (`how` "paste") or drop an image file into the page, as a person's clipboard or drag does."""


def test_images_pasted_dropped_and_picked_are_sent_and_shown_after_reload(
        tmp_path: Path, browser_tab: WebDriver) -> None:
    """An image pasted into the composer, one dropped on the conversation and one picked with the
    file chooser show as thumbnails, one removed again; the message goes through the AI SDK door
    with the other two as file parts, the model reads them as images, and after a reload the
    message shows both, read back from the server."""
    pasted, dropped, picked = png(3, 2), png(5, 4), png(7, 6)
    chosen = tmp_path / "picked.png"
    chosen.write_bytes(picked)
    with served(tmp_path, reply("Two grey squares.")) as page:
        open_new_conversation(browser_tab, page)
        wait(browser_tab, lambda d: d.find_element(By.ID, "prompt"))
        browser_tab.execute_script(ATTACH_JS, "paste", base64.b64encode(pasted).decode(), "pasted.png")
        browser_tab.execute_script(ATTACH_JS, "drop", base64.b64encode(dropped).decode(), "dropped.png")
        browser_tab.find_element(By.ID, "attach-input").send_keys(str(chosen))
        wait(browser_tab, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#attachments img")) == 3)
        browser_tab.find_elements(By.CSS_SELECTOR, "#attachments button")[1].click()  # the dropped one
        wait(browser_tab, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#attachments img")) == 2)

        say(browser_tab, "what are these?")
        shown(browser_tab, "#transcript .assistant", "Two grey squares.")
        wait(browser_tab, idle)
        assert not browser_tab.find_elements(By.CSS_SELECTOR, "#attachments img")
        prompt = page.served.faux.requests[0].request.messages[-1]
        assert isinstance(prompt, UserMessage)
        assert not isinstance(prompt.content, str)
        assert [part.data for part in prompt.content if isinstance(part, ImageContent)] == [
            base64.b64encode(pasted).decode(), base64.b64encode(picked).decode()]

        browser_tab.refresh()
        shown(browser_tab, "#transcript .user", "what are these?")

        def sizes(d: WebDriver) -> list[list[int]] | None:
            read = d.execute_script("return [...document.querySelectorAll('#transcript .user img')]"
                                    ".map((img) => [img.naturalWidth, img.naturalHeight])")
            return read if read and all(width for width, _ in read) else None
        assert wait(browser_tab, sizes) == [[3, 2], [7, 6]]


def test_a_garden_shows_its_goals_and_its_replies_apart_from_its_notes(
        tmp_path: Path, browser_tab: WebDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The list offers the user's gardens; one opened shows its goals, each with the actions its
    status allows (a pause takes effect), and its inbox: the replies it gave in conversations
    apart from its notes, newest first, as Markdown."""
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))  # where the server reaches the gardens
    with served(tmp_path) as page:
        async def plant() -> Garden:
            service = page.served.service
            garden = await Garden.create("allotment", Gardener(model=FAUX), GardenSetup(
                store=service.store, service=service, models=service.setup.models), Context({"test": "page"}),
                owner=USER)
            await garden.add_goal("tend", "Water the beds", Context({"test": "page"}))
            await garden.close(Context({"test": "page"}))
            return garden
        garden = page.run(plant)
        for folder, name, text in ((garden.root.reply_dir, "r1.md", "Tomatoes want **sun**."),
                                   (garden.root.notes_dir, "n1.md", "Beds watered."),
                                   (garden.root.notes_dir, "n2.md", "Roses need a person.")):
            garden.root.write_file(folder / name, text)
            os.utime(folder / name, ns=(int(name[1]) * 10**9,) * 2)  # n2 newer than n1

        browser_tab.get(page.url)
        shown(browser_tab, "#gardens a", "allotment").click()
        goal = shown(browser_tab, "#goals li", "Water the beds")
        assert "tend · active" in goal.text
        replies = shown(browser_tab, "#replies", "Tomatoes")
        assert replies.find_element(By.CSS_SELECTOR, ".inbox-file strong").text == "sun"
        notes = [note.text for note in browser_tab.find_elements(By.CSS_SELECTOR, "#notes .inbox-file")]
        assert notes == ["Roses need a person.", "Beds watered."]
        assert "Roses" not in replies.text

        goal.find_element(By.CSS_SELECTOR, 'button[data-action="pause"]').click()
        wait(browser_tab, lambda d: d.find_element(By.CSS_SELECTOR, "#goals li").get_attribute("data-status")
             == "paused")
        assert "?g=allotment" in browser_tab.current_url


LONG_TURNS = 1_000
"""Turns of the long conversation: 2,000 messages, twenty display pages."""


async def long_conversation(store: Store, ctx: Context) -> str:
    """A conversation of `USER` holding `LONG_TURNS` turns, written in one transaction as an
    import writes one; its id. Turn N is `question N` and `answer N`."""
    plan = ImportPlan(source_format="test", path=Path("long"), model=FAUX, name="Long")
    for turn in range(LONG_TURNS):
        plan.add(MessagePayload(message=UserMessage(content=f"question {turn}")))
        plan.add(MessagePayload(message=AssistantMessage(
            content=[TextContent(text=f"answer {turn} with **bold** and `code`")], api="faux", provider="faux",
            model="faux", stop_reason="stop")))
    return (await write_plan(store, plan, USER, ctx)).session_id


def more_rows_than(count: int, driver: WebDriver) -> bool:
    """Whether the transcript draws more than `count` rows. Read in one script, not element by
    element: 2,000 rows read over WebDriver one by one take minutes."""
    return bool(driver.execute_script("return document.querySelectorAll('#transcript > .row').length > arguments[0]",
                                      count))


def test_a_conversation_of_two_thousand_messages_opens_at_its_end_and_reads_back_as_it_scrolls(
        tmp_path: Path, browser_tab: WebDriver) -> None:
    """A conversation of 2,000 messages opens at its newest rows from one page of the display,
    not the whole history; scrolled to the top it reads the older pages one by one, the rows in
    view staying where they were, back to the first message."""
    with served(tmp_path) as page:
        conversation_id = page.run(lambda: long_conversation(page.served.service.store, Context({"test": "page"})))
        browser_tab.get(f"{page.url}/?c={conversation_id}")
        shown(browser_tab, "#transcript .assistant", f"answer {LONG_TURNS - 1}")
        assert len(rows(browser_tab)) == 100  # one page drawn, not the whole history

        drawn = "return [...document.querySelectorAll('#transcript > .row')].map((row) => row.innerText)"
        top = "return arguments[0].getBoundingClientRect().top"
        box = browser_tab.find_element(By.ID, "transcript")
        pages = 1
        while not (texts := browser_tab.execute_script(drawn))[0].startswith("question 0"):
            first = browser_tab.find_element(By.CSS_SELECTOR, "#transcript > .row")
            browser_tab.execute_script("arguments[0].scrollTop = 0", box)
            before = browser_tab.execute_script(top, first)
            wait(browser_tab, partial(more_rows_than, len(texts)))
            assert abs(browser_tab.execute_script(top, first) - before) <= 2  # still where it was read
            pages += 1
        assert pages == 2 * LONG_TURNS // 100
        assert len(texts) == 2 * LONG_TURNS


def event_rows(count: int, driver: WebDriver) -> bool:
    """Whether the transcript shows `count` event rows."""
    return len(driver.find_elements(By.CSS_SELECTOR, "#transcript .event")) == count


TYPED = ("/rename Trip to Lisbon", "/mode plan", "/tools", "/model nowhere/none")
"""Commands a person types: three that run and one that fails as it runs."""


def test_commands_typed_in_the_page_record_and_show_the_rows_the_terminal_does(
        tmp_path: Path, browser_tab: WebDriver) -> None:
    """Each command typed in the page (completed from the command table) records the row the
    terminal's chat records for the same command, and the page words it as the terminal does; a
    command that fails as it runs is its failure row, as in the terminal, not a problem of the
    composer, which is left empty; an unknown one is the composer's problem and stays typed."""
    with served(tmp_path) as page:
        open_new_conversation(browser_tab, page)
        conversation_id = browser_tab.current_url.split("?c=")[1]
        wait(browser_tab, lambda d: d.find_element(By.ID, "prompt")).send_keys("/ren")
        shown(browser_tab, "#commands li", "/rename NAME")
        browser_tab.find_element(By.ID, "prompt").send_keys(Keys.TAB)
        assert browser_tab.find_element(By.ID, "prompt").get_attribute("value") == "/rename "
        browser_tab.find_element(By.ID, "prompt").send_keys(Keys.CONTROL, "a", Keys.DELETE)
        for count, line in enumerate(TYPED, start=1):
            say(browser_tab, line)
            wait(browser_tab, partial(event_rows, count))
        assert browser_tab.find_element(By.ID, "prompt").get_attribute("value") == ""
        assert not browser_tab.find_elements(By.ID, "error")
        shown_rows = rows(browser_tab)

        async def the_terminals_way() -> tuple[list[ChatEventDetails], list[ChatEventDetails]]:
            service, context = page.served.service, Context({"test": "page"})
            tools = [page.write.name, page.edit.name]  # as the server's new conversations have them
            other = await service.create(USER, LaneConfig(model=FAUX, active_tools=tools), context)
            for line in TYPED:  # as `harness chat` runs them: the conversation's command, on the live conversation
                with contextlib.suppress(HarnessError):
                    await run_typed_command(service, USER, other, line, context)
            recorded = [(await service.read_display(USER, conversation, context)).rows
                        for conversation in (conversation_id, other.id)]
            page_rows, terminal_rows = ([row.details for row in read if isinstance(row, EventRow)] for read in recorded)
            return page_rows, terminal_rows
        in_the_page, in_the_terminal = page.run(the_terminals_way)

        assert in_the_page == in_the_terminal
        assert shown_rows == [Text.from_markup(chat_row(details)).plain for details in in_the_page]
        assert shown_rows[-1].startswith("/model nowhere/none: failed: model nowhere/none is not available")

        say(browser_tab, "/nothing-like-it")
        assert "unknown_command" in shown(browser_tab, "#error", "nothing-like-it").text
        assert browser_tab.find_element(By.ID, "prompt").get_attribute("value") == "/nothing-like-it"


PROJECTS = """\
[[projects]]
id = 1
slug = "alpha"
path = "{alpha}"

[[projects]]
id = 2
slug = "beta"
path = "{beta}"
"""


def test_the_project_picker_lists_the_projects_and_moves_the_conversation(
        tmp_path: Path, browser_tab: WebDriver) -> None:
    """The picker lists the server's projects (`projects.toml`); a pick moves the conversation
    there, with the row the terminal shows for it, and the conversation's tools run there."""
    for name in ("alpha", "beta"):
        (tmp_path / name).mkdir()
    projects = tmp_path / "projects.toml"
    projects.write_text(PROJECTS.format(alpha=tmp_path / "alpha", beta=tmp_path / "beta"))
    with served(tmp_path, reply("Hi."), projects_file=projects) as page:
        open_new_conversation(browser_tab, page)
        conversation_id = browser_tab.current_url.split("?c=")[1]
        say(browser_tab, "hi")  # a conversation nobody spoke in records no move (CE-13)
        wait(browser_tab, idle)
        picker = wait(browser_tab, lambda d: d.find_element(By.ID, "project"))
        options = [option.text for option in picker.find_elements(By.TAG_NAME, "option")]
        assert options == ["Project…", "alpha", "beta"]

        Select(picker).select_by_visible_text("beta")

        row = shown(browser_tab, '#transcript .event[data-kind="cwd"]', "project: beta")
        assert row.text == f"project: beta ({tmp_path / 'beta'})"
        conversation = page.served.service.live(conversation_id)
        assert conversation is not None
        assert conversation.target.directory == tmp_path / "beta"
