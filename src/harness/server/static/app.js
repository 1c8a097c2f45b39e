// The page: the conversation list, one conversation's live view, the composer, Stop, the model
// picker and the connection indicator.
//
// A turn streams over the AI SDK UI message stream (`POST /api/chat`; `GET /api/chat/{id}/stream`
// resumes the turn in progress by replaying it from its start), approval requests included. The
// conversation's native watch (`.../events`) says when a turn starts that this tab did not send
// (another tab's, or one the server resumed), when a call's approval was answered (here or in
// another tab), and carries what is written between turns: a model switch's row is drawn at once;
// any other entry (a delegated job's result, a garden's message, a shell row) reads the display
// again. When a turn ends the page reads the display again: the journal's rows replace what was
// drawn live. A turn's stream also ends where a tool call waits for approval (the protocol's pause):
// the page keeps what it drew, and once the call is answered follows the rest with the resume route.

import { ApiError, json, request, serverSentEvents, setToken } from "./api.js";
import { Transcript } from "./transcript.js";
import { modelName } from "./words.js";

const routes = {
  conversations: "/api/conversations",
  models: "/api/models",
  conversation: (id) => `/api/conversations/${encodeURIComponent(id)}`,
  display: (id, before) => `/api/conversations/${encodeURIComponent(id)}/display` +
    (before ? `?before=${encodeURIComponent(before)}` : ""),
  image: (id, ref) => `/api/conversations/${encodeURIComponent(id)}/images/${encodeURIComponent(ref)}`,
  events: (id) => `/api/conversations/${encodeURIComponent(id)}/events`,
  steer: (id) => `/api/conversations/${encodeURIComponent(id)}/steer`,
  followUp: (id) => `/api/conversations/${encodeURIComponent(id)}/follow-up`,
  model: (id) => `/api/conversations/${encodeURIComponent(id)}/model`,
  approval: (id, toolCallId) => `/api/conversations/${encodeURIComponent(id)}/approvals/${encodeURIComponent(toolCallId)}`,
  chat: "/api/chat",
  resume: (id) => `/api/chat/${encodeURIComponent(id)}/stream`,
  stop: (id) => `/api/chat/${encodeURIComponent(id)}/stop`,
};

const RETRY_MS = [250, 500, 1000, 2000, 4000];
const MAIN_LANE = "main";

const $ = (id) => document.getElementById(id);
const images = new Map();

let current = null; // {id, streaming: AbortController|null, watch: AbortController, nextBefore}

const transcript = new Transcript($("transcript"), {
  onApproval: (answer) => answerApproval(answer),
  loadImage: (ref) => imageUrl(current.id, ref),
});

function showError(error) {
  const box = $("error");
  if (error == null) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  box.textContent = error instanceof ApiError ? `${error.message} (${error.code})` : String(error.message ?? error);
  box.dataset.code = error.code ?? "";
}

function setConnection(state) {
  $("connection").dataset.state = state;
}

function setRunning(running) {
  $("stop").hidden = !running;
  $("while-running").hidden = !running;
  $("send").textContent = running ? "Send while it runs" : "Send";
  $("conversation").dataset.running = running ? "true" : "false";
}

// -- signing in: a 401 asks for a token once, then retries ------------------------------------------

function signIn() {
  const dialog = $("sign-in");
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      setToken($("token").value.trim());
      resolve();
    }, { once: true });
    dialog.showModal();
  });
}

async function authorized(call) {
  for (;;) {
    try {
      return await call();
    } catch (error) {
      if (!(error instanceof ApiError) || error.status !== 401) throw error;
      await signIn();
    }
  }
}

// -- the conversation list ---------------------------------------------------------------------------

async function listConversations() {
  const list = $("conversations");
  const conversations = await authorized(() => json("GET", routes.conversations));
  list.replaceChildren(...conversations.map((conversation) => {
    const item = document.createElement("li");
    const link = document.createElement("a");
    link.href = `?c=${encodeURIComponent(conversation.id)}`;
    link.dataset.id = conversation.id;
    link.textContent = conversation.name ?? `Conversation ${conversation.id.slice(0, 8)}`;
    if (current?.id === conversation.id) link.setAttribute("aria-current", "page");
    link.addEventListener("click", (event) => {
      event.preventDefault();
      history.pushState(null, "", link.href);
      openConversation(conversation.id).catch(showError);
    });
    item.append(link);
    return item;
  }));
  return conversations;
}

async function newConversation() {
  const conversation = await authorized(() => json("POST", routes.conversations, {}));
  history.pushState(null, "", `?c=${encodeURIComponent(conversation.id)}`);
  await listConversations();
  await openConversation(conversation.id);
}

// -- one conversation ------------------------------------------------------------------------------------

async function openConversation(id) {
  if (current) {
    current.streaming?.abort();
    current.watch.abort();
  }
  // `opened`: settled once the view is drawn and the server said whether a turn runs; a message
  // typed before then waits for it instead of racing the view's first read.
  let answered;
  current = { id, streaming: null, watch: new AbortController(), nextBefore: null, pendingModel: null,
    reading: false, readAgain: false, opened: new Promise((resolve) => { answered = resolve; }) };
  for (const link of document.querySelectorAll("#conversations a")) {
    if (link.dataset.id === id) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  $("conversation").hidden = false;
  showError(null);
  setRunning(false);
  transcript.clear();
  try {
    const info = await authorized(() => json("GET", routes.conversation(id)));
    $("title").textContent = info.name ?? `Conversation ${id.slice(0, 8)}`;
    await showModel(info);
    await readDisplay();
    watch(current);
    await resume(current, answered);
  } finally {
    answered();
  }
}

async function readDisplay({ older = false } = {}) {
  const conversation = current;
  const page = await authorized(() => json("GET", routes.display(conversation.id, older ? conversation.nextBefore : null)));
  // A turn that started meanwhile draws its rows live: the page this read got must not drop them.
  if (conversation !== current || (!older && conversation.streaming)) return;
  if (!older) transcript.dropLive();
  transcript.showRows(page.rows, { older });
  if (older || conversation.nextBefore == null) {
    conversation.nextBefore = page.next_before;
    $("older").hidden = page.next_before == null;
  }
}

async function imageUrl(conversationId, ref) {
  const key = `${conversationId}/${ref}`;
  if (!images.has(key)) {
    images.set(key, request("GET", routes.image(conversationId, ref))
      .then((response) => response.blob())
      .then((blob) => URL.createObjectURL(blob)));
  }
  return images.get(key);
}

// -- the turn's stream ------------------------------------------------------------------------------------

/**
 * Draw a UI message stream until its message ends. A connection that drops mid-turn reconnects to
 * the resume route, which replays the turn from its start over what is drawn (the same rows).
 */
async function follow(conversation, open, answered = () => {}) {
  if (conversation.streaming) return;
  const controller = new AbortController();
  conversation.streaming = controller;
  let attempt = 0;
  try {
    for (;;) {
      let response;
      try {
        response = await open(controller.signal);
        answered(); // the first answer says whether a turn runs
      } catch (error) {
        if (controller.signal.aborted) return;
        if (error instanceof ApiError) throw error;
        setConnection("reconnecting");
        await pause(RETRY_MS[Math.min(attempt++, RETRY_MS.length - 1)], controller.signal);
        open = (signal) => request("GET", routes.resume(conversation.id), { signal });
        continue;
      }
      if (response.status === 204) return; // nothing runs
      setRunning(true);
      try {
        for await (const event of serverSentEvents(response)) {
          if (event.data === "[DONE]") return;
          attempt = 0;
          setConnection("live");
          if (transcript.apply(JSON.parse(event.data))) return;
        }
        return; // the server ended the stream: the turn is over
      } catch (error) {
        if (controller.signal.aborted) return;
        setConnection("reconnecting");
        await pause(RETRY_MS[Math.min(attempt++, RETRY_MS.length - 1)], controller.signal);
        open = (signal) => request("GET", routes.resume(conversation.id), { signal });
      }
    }
  } finally {
    if (conversation.streaming === controller) conversation.streaming = null;
    if (conversation === current && !controller.signal.aborted && !transcript.waitingForApproval()) {
      setRunning(false);
      await readDisplay().catch(showError);
    }
  }
}

function resume(conversation, answered) {
  return follow(conversation, (signal) => request("GET", routes.resume(conversation.id), { signal }), answered);
}

/** Whether the page draws a turn: its stream is open, or paused on a call waiting for approval. */
function following(conversation) {
  return conversation.streaming != null || transcript.waitingForApproval();
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

// -- the native watch: turns this tab did not start, rows written between turns ------------------------

async function watch(conversation) {
  const signal = conversation.watch.signal;
  let lastEventId = null;
  let attempt = 0;
  while (!signal.aborted) {
    try {
      const response = await request("GET", routes.events(conversation.id), { signal, lastEventId });
      setConnection("live");
      attempt = 0;
      for await (const event of serverSentEvents(response)) {
        if (event.id != null) lastEventId = event.id;
        observe(conversation, event);
      }
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof ApiError && error.status !== 503) {
        showError(error);
        return;
      }
    }
    setConnection("reconnecting");
    await pause(RETRY_MS[Math.min(attempt++, RETRY_MS.length - 1)], signal);
  }
}

function observe(conversation, event) {
  const data = JSON.parse(event.data);
  switch (event.event) {
    case "snapshot":
      if (data.operation?.kind === "run") resume(conversation).catch(showError);
      return;
    case "approval":
      if (data.answer) {
        transcript.approvalAnswered(data.pending.tool_call_id, data.answer.allow);
        resume(conversation).catch(showError); // a stream paused on the call goes on
      }
      return;
    default:
      break;
  }
  if (data.lane !== MAIN_LANE) return; // a delegated agent's lane: its result comes as a row of main's
  switch (data.type) {
    case "run_start":
      resume(conversation).catch(showError);
      break;
    case "chat_event":
      if (!conversation.streaming) {
        const row = transcript.eventRow(data.row.id, data.row.details);
        if (row) transcript.put(row);
      }
      if (data.row.details.kind === "model") reconcileModel(data.row.details.model);
      break;
    case "entry_added":
      if (!following(conversation) && !transcript.find(data.entry.id)) readSoon(conversation).catch(showError);
      break;
    default:
      break;
  }
}

/** Read the display for entries written between turns: one read at a time, one more after it for
 * whatever came while it ran. */
async function readSoon(conversation) {
  if (conversation.reading) {
    conversation.readAgain = true;
    return;
  }
  conversation.reading = true;
  try {
    do {
      conversation.readAgain = false;
      await readDisplay();
    } while (conversation.readAgain && conversation === current);
  } finally {
    conversation.reading = false;
  }
}

// -- composing: a new turn, or a steer or follow-up while one runs -------------------------------------

async function send(text) {
  await choosing;
  const conversation = current;
  if (!conversation) throw new Error("open a conversation or start a new one first");
  await conversation.opened;
  if (following(conversation)) {
    const route = $("delivery").value === "steer" ? routes.steer : routes.followUp;
    await authorized(() => json("POST", route(conversation.id), { text }));
    transcript.pendingUser(text);
    return;
  }
  const message = { id: crypto.randomUUID(), role: "user", parts: [{ type: "text", text }] };
  const body = { id: conversation.id, messages: [message], trigger: "submit-message" };
  const row = transcript.pendingUser(text);
  await follow(conversation, async (signal) => {
    const response = await authorized(() => request("POST", routes.chat, { body, signal }));
    row.classList.remove("pending"); // accepted: the turn is durable
    return response;
  });
}

async function stop() {
  await authorized(() => json("POST", routes.stop(current.id)));
}

async function answerApproval({ toolCallId, approved }) {
  const conversation = current;
  try {
    await authorized(() => json("POST", routes.approval(conversation.id, toolCallId), { allow: approved }));
    transcript.approvalAnswered(toolCallId, approved);
    await resume(conversation);
  } catch (error) {
    showError(error);
  }
}

// -- the model picker: a queued switch is shown as such until the model row says it happened ---------

async function showModel(info) {
  const picker = $("model");
  const models = await authorized(() => json("GET", routes.models)).catch(() => []);
  picker.replaceChildren(...models.map((model) => new Option(model.name ?? modelName(model), modelName(model))));
  if (info?.model) reconcileModel(info.model);
}

function reconcileModel(model) {
  const picker = $("model");
  const name = modelName(model);
  if (![...picker.options].some((option) => option.value === name)) picker.append(new Option(name, name));
  picker.value = name;
  picker.dataset.current = name;
  if (current) current.pendingModel = null;
  $("model-state").textContent = "";
}

async function switchModel() {
  const picker = $("model");
  const [provider, ...rest] = picker.value.split("/");
  const conversation = current;
  conversation.pendingModel = picker.value;
  $("model-state").textContent = "switching…";
  try {
    const answer = await authorized(() => json("PUT", routes.model(conversation.id),
      { model: { provider, model_id: rest.join("/") } }));
    if (answer?.queued) $("model-state").textContent = "switches when the turn ends";
    else reconcileModel(answer.model);
  } catch (error) {
    picker.value = picker.dataset.current ?? "";
    $("model-state").textContent = "";
    showError(error);
  }
}

// -- wiring ----------------------------------------------------------------------------------------------

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value;
  if (!text.trim()) return;
  $("prompt").value = "";
  showError(null);
  send(text).catch(showError);
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => stop().catch(showError));
$("model").addEventListener("change", () => switchModel());
$("older").addEventListener("click", () => readDisplay({ older: true }).catch(showError));
$("new-conversation").addEventListener("click", () => newConversation().catch(showError));
window.addEventListener("popstate", () => boot().catch(showError));

// Settled once the page knows which conversation its address opens: a message typed while the
// page loads waits for it instead of finding none open.
let chosen;
const choosing = new Promise((resolve) => { chosen = resolve; });

async function boot() {
  try {
    const conversations = await listConversations();
    const id = new URLSearchParams(location.search).get("c");
    if (id && conversations.some((conversation) => conversation.id === id)) {
      const opening = openConversation(id); // makes it current before its first await
      chosen();
      await opening;
    }
  } finally {
    chosen();
  }
}

boot().catch(showError);
