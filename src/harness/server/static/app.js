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
import { chatEventWords, modelName } from "./words.js";

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

// {id, streaming: AbortController|null, watch: AbortController, nextBefore, pick: the model switch
// this tab waits on, modelRows/modelAt: the model rows handled (ids, newest event id), ...}
let current = null;

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
  current = { id, streaming: null, watch: new AbortController(), nextBefore: null, pick: null,
    modelRows: new Set(), modelAt: null, reading: false, readAgain: false,
    opened: new Promise((resolve) => { answered = resolve; }) };
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
    await readDisplay({ opening: true });
    watch(current);
    await resume(current, answered);
  } finally {
    answered();
  }
}

/** Read the display (`older`: the page before the rows shown). The rows of the opening read and
 * of an older page are old: the model in force came from the conversation itself, and only rows
 * written since settle the picker. */
async function readDisplay({ older = false, opening = false } = {}) {
  const conversation = current;
  const page = await authorized(() => json("GET", routes.display(conversation.id, older ? conversation.nextBefore : null)));
  // A turn that started meanwhile draws its rows live: the page this read got must not drop them.
  if (conversation !== current || (!older && conversation.streaming)) return;
  if (!older) transcript.dropLive();
  transcript.showRows(page.rows, { older });
  for (const row of page.rows) {
    if (row.kind === "event") settleModel(conversation, row.id, row.details, { old: older || opening });
  }
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
      // `reset`: the watch resumed past what the server's log holds; rows written meanwhile
      // (a switch's outcome among them) are read from the display.
      if (data.reset) readSoon(conversation).catch(showError);
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
      settleModel(conversation, data.row.id, data.row.details, { eventId: event.id });
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

// -- the model picker: a queued switch is shown as such until its row says how it went (CE-12) -------

async function showModel(info) {
  const picker = $("model");
  const models = await authorized(() => json("GET", routes.models)).catch(() => []);
  picker.replaceChildren(...models.map((model) => new Option(model.name ?? modelName(model), modelName(model))));
  if (info?.model) reconcileModel(info.model);
}

/** `model` is in force: the picker shows it and no pick of this tab waits any more. */
function reconcileModel(model) {
  inForce(model);
  settlePick();
}

function inForce(model) {
  const picker = $("model");
  const name = modelName(model);
  if (![...picker.options].some((option) => option.value === name)) picker.append(new Option(name, name));
  picker.dataset.current = name;
}

function settlePick() {
  const picker = $("model");
  picker.value = picker.dataset.current ?? "";
  if (current) current.pick = null;
  $("model-state").textContent = "";
}

/**
 * Settle the picker from a row of the conversation: a `model` row (a switch landed) or an error
 * row with a model-switch-failed notice (a queued switch failed after its acknowledgement), from
 * the watch (`eventId`, the watch's `seq` or `seq.k`) or a display read (no event id; `old`: a row
 * from before the page opened, only noted). Each row is handled once: one whose id was handled, or
 * whose event id is not after the newest handled, is a retry's copy (a resumed watch, the display
 * read again) and must not undo a newer pick (CE-12: retries ignore observed event ids).
 */
function settleModel(conversation, rowId, details, { eventId = null, old = false } = {}) {
  const failed = details.kind === "error" && details.notice?.code === "model-switch-failed";
  if (details.kind !== "model" && !failed) return;
  const at = eventId == null ? null : position(eventId);
  if (conversation.modelRows.has(rowId) || (at && conversation.modelAt && !after(at, conversation.modelAt))) return;
  conversation.modelRows.add(rowId);
  if (at) conversation.modelAt = at;
  if (old || conversation !== current) return;
  const selection = modelName(failed ? details.notice.requested : details.model);
  if (!failed) inForce(details.model);
  const pick = conversation.pick;
  // Before its answer, a row of another selection is an earlier switch's: the answer says how the
  // pick went. Once acknowledged it is the one pick the server waits on, so the next outcome ends
  // it: its own, or that of the pick that superseded it.
  if (pick != null && pick.model !== selection && !pick.acknowledged) return;
  settlePick();
  if (failed && pick?.model === selection) {
    showError({ message: chatEventWords(details).text, code: details.notice.code });
  }
}

/** An event id of the watch as `[seq, part]`: `12.1` is event 12's first row, `12` all of it. */
function position(eventId) {
  const [seq, part] = eventId.split(".");
  return [Number(seq), part == null ? Infinity : Number(part)];
}

function after([seq, part], [seenSeq, seenPart]) {
  return seq > seenSeq || (seq === seenSeq && part > seenPart);
}

/**
 * Switch to the picked model. The pick is tracked from here: its answer is ignored once a row
 * settled it (a row can overtake a late acknowledgement) or a later pick superseded it (whose
 * 409 `model_switch_refused` is expected, not an error to show).
 */
async function switchModel() {
  const picker = $("model");
  const conversation = current;
  const pick = { model: picker.value, acknowledged: false };
  conversation.pick = pick;
  $("model-state").textContent = "switching…";
  const [provider, ...rest] = pick.model.split("/");
  try {
    const answer = await authorized(() => json("PUT", routes.model(conversation.id),
      { model: { provider, model_id: rest.join("/") } }));
    if (conversation !== current || conversation.pick !== pick) return;
    if (answer?.queued) {
      pick.acknowledged = true;
      $("model-state").textContent = "switches when the turn ends";
    } else {
      reconcileModel(answer.model);
    }
  } catch (error) {
    if (conversation !== current || conversation.pick !== pick) return;
    settlePick();
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
