// One conversation's view: its rows, the turn streaming now, the composer (messages with images
// pasted, dropped or picked, slash commands, steers and follow-ups while a turn runs), Stop, the
// model and project pickers, the connection and what the conversation spent. A long history is
// read a page at a time, the older pages as the person scrolls back.
//
// A turn is the AI SDK's `useChat` on the server's UI message stream (`POST /api/chat`; `GET
// /api/chat/{id}/stream` replays the turn in progress from its start, so the transport says its
// resumes are replays and the client rebuilds the message instead of appending to it). An approval
// request pauses the stream; the answer (`addToolApprovalResponse`) is sent automatically and the
// same message goes on. The conversation's native watch (`.../events`) says when a turn starts that
// this tab did not send (another tab's, or one the server resumed), when a call's approval was
// answered elsewhere, and carries what is written between turns (a model switch's row, a command's,
// a delegated job's result). When a turn ends the page reads the display again: the journal's rows
// replace the ones drawn live.
//
// A turn this tab resumes (on opening, or another tab's) replays from its start what the display
// read already shows after its prompt: while its message is live, the read's rows after the newest
// prompt are the turn's and are not drawn.

import { useChat } from "@ai-sdk/react";
import {
  DefaultChatTransport,
  type FileUIPart,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  type UIMessage,
} from "ai";
import {
  type ClipboardEvent,
  type DragEvent,
  type FormEvent,
  type KeyboardEvent,
  useCallback,
  useEffect,
  useLayoutEffect,
  useMemo,
  useRef,
  useState,
} from "react";
import {
  api,
  ApiError,
  authorizedFetch,
  type ChatEventDetails,
  type CommandInfo,
  type ConversationView as Info,
  type DisplayRow,
  type ModelIdentity,
  type ModelInfo,
  modelName,
  type Project,
  serverSentEvents,
  type Usage,
} from "./api";
import { displayRows, liveRows, type Row, type RowActions, RowView } from "./rows";
import { chatEventWords } from "./words";

const RETRY_MS = [250, 500, 1000, 2000, 4000];
/** Failed tries to reach the server after which the page says it is offline, not reconnecting
 * (about four seconds of trying, by `RETRY_MS`). */
const OFFLINE_AFTER = 5;
/** How long the page waits before it says it lost the server (it may be back at once). */
const SETTLE_MS = 1000;
/** The largest image the server keeps (its image store's limit). */
const MAX_IMAGE_BYTES = 5 * 1024 * 1024;

/** How the page reaches the server: `connecting` until the watch first answers. */
type Connection = "connecting" | "connected" | "reconnecting" | "offline";
const CONNECTION_WORDS: Record<Connection, string> = {
  connecting: "connecting…", connected: "connected", reconnecting: "reconnecting…", offline: "offline",
};

/** What the page reads of a watch event's data (the rest it leaves alone). */
interface Watched {
  reset?: boolean;
  operation?: { kind: string } | null;
  answer?: unknown;
  lane?: string;
  type?: string;
  row?: { id: string; details: ChatEventDetails };
}
const MAIN_LANE = "main";

/** The chat door's transport: its resume route replays the turn from its start. */
class ReplayingTransport extends DefaultChatTransport<UIMessage> {
  readonly resumeStreamIsReplay = true;
}

export interface Shared {
  models: ModelInfo[];
  projects: Project[];
  commands: CommandInfo[];
  /** The conversation's name or times changed: the list reads them again. */
  changed: () => void;
}

interface Problem {
  text: string;
  code: string;
}

function problemOf(error: unknown): Problem {
  if (error instanceof ApiError) return { text: `${error.message} (${error.code})`, code: error.code };
  const text = error instanceof Error ? error.message : String(error);
  try {
    // The chat transport's error is the body of the server's answer.
    const body = JSON.parse(text) as { code?: string; message?: string };
    if (body.code) return { text: `${body.message} (${body.code})`, code: body.code };
  } catch {
    // not a server's answer
  }
  return { text, code: "" };
}

const isNetworkError = (error: unknown) => error instanceof TypeError;

/** An event id of the watch as `[seq, part]`: `12.1` is event 12's first row, `12` all of it. */
function position(eventId: string): [number, number] {
  const [seq, part] = eventId.split(".");
  return [Number(seq), part == null ? Infinity : Number(part)];
}

function after([seq, part]: [number, number], [seenSeq, seenPart]: [number, number]): boolean {
  return seq > seenSeq || (seq === seenSeq && part > seenPart);
}

/** Wait `ms`, or less when `signal` aborts or the browser says it is back online. */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      window.removeEventListener("online", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    window.addEventListener("online", done);
    signal.addEventListener("abort", done, { once: true });
  });
}

/** A read file as a data URL. */
function dataUrl(file: File): Promise<string> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result as string);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

/** Tokens and dollars as the terminal's status line says them: `1,234 tokens · $0.0123`. */
function spentWords(usage: Usage): string {
  return `${usage.total_tokens.toLocaleString("en-US")} tokens · $${usage.cost.total.toFixed(4)}`;
}

/** The conversation `id`, named `name` (the list's, which follows renames and naming from the first
 * prompt), `menu` the button that opens the list on a narrow screen. */
export function ConversationView({ id, name, shared, menu }: { id: string; name: string | null; shared: Shared;
  menu: React.ReactNode }) {
  const [info, setInfo] = useState<Info | null>(null);
  const [rows, setRows] = useState<DisplayRow[]>([]);
  const [nextBefore, setNextBefore] = useState<string | null>(null);
  const rowsRef = useRef(rows);
  rowsRef.current = rows;
  const [resumed, setResumed] = useState(false);
  const [problem, setProblem] = useState<Problem | null>(null);
  const [link, setLink] = useState<Connection>("connecting");
  const [online, setOnline] = useState(navigator.onLine);
  const [spent, setSpent] = useState<Usage | null>(null);
  const [attachments, setAttachments] = useState<FileUIPart[]>([]);
  const [draft, setDraft] = useState("");
  const [delivery, setDelivery] = useState<"steer" | "follow-up">("steer");
  const [inForce, setInForce] = useState("");
  const [picked, setPicked] = useState("");
  const [modelState, setModelState] = useState("");

  const alive = useRef(new AbortController());
  const retry = useRef(0);
  // The model rows handled (ids, newest event id) and the pick this tab waits on (CE-12).
  const model = useRef({ rows: new Set<string>(), at: null as [number, number] | null,
    pick: null as { model: string; acknowledged: boolean } | null });
  const reading = useRef({ busy: false, again: false });

  const transport = useMemo(() => new ReplayingTransport({ api: "/api/chat", fetch: authorizedFetch }), []);
  const chat = useChat({
    id,
    transport,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onFinish: ({ message, isAbort, isDisconnect }) => {
      if (isAbort || isDisconnect || alive.current.signal.aborted) return;
      retry.current = 0;
      setLink("connected");
      if (waitsForApproval(message)) return; // the stream paused: the answer goes on with it
      turnEnded().catch(show);
    },
    onError: (error) => {
      if (alive.current.signal.aborted) return;
      if (isNetworkError(error)) {
        reconnect();
        return;
      }
      const found = problemOf(error);
      if (found.code) setProblem(found); // a stream's own failure is a row of the conversation
    },
  });
  const chatRef = useRef(chat);
  chatRef.current = chat;

  const streaming = chat.status === "submitted" || chat.status === "streaming";
  const liveMessage = chat.messages.findLast((message) => message.role === "assistant");
  const paused = liveMessage != null && waitsForApproval(liveMessage);
  const running = streaming || paused;

  const show = useCallback((error: unknown) => {
    if (!alive.current.signal.aborted) setProblem(problemOf(error));
  }, []);

  /** The newest page of the display; the turn's live message is dropped in the same render. Older
   * pages read since (scrolling back) stay: the page is laid over the rows from its first one on. */
  const readDisplay = useCallback(async () => {
    const page = await api.display(id);
    if (alive.current.signal.aborted) return;
    const current = rowsRef.current;
    const first = page.rows[0];
    const at = first == null ? -1 : current.findLastIndex((row) => row.kind === first.kind && row.id === first.id);
    if (at > 0) {
      setRows([...current.slice(0, at), ...page.rows]);
    } else {
      setRows(page.rows);
      setNextBefore(page.next_before);
    }
    for (const row of page.rows) if (row.kind === "event") settleModel(row.id, row.details, { old: true });
    return page;
  }, [id]);

  const readUsage = useCallback(async () => {
    const usage = await api.usage(id);
    if (!alive.current.signal.aborted) setSpent(usage);
  }, [id]);

  const turnEnded = useCallback(async () => {
    readUsage().catch(show);
    await readDisplay();
    chatRef.current.setMessages([]);
    setResumed(false);
    shared.changed();
  }, [readDisplay, readUsage, shared, show]);

  /** Follow the turn in progress, replayed from its start (nothing when none runs). */
  const follow = useCallback(() => {
    const current = chatRef.current;
    if (current.status === "submitted" || current.status === "streaming") return;
    setResumed(true);
    current.resumeStream().catch(show);
  }, [show]);

  const reconnect = useCallback(() => {
    setLink(retry.current >= OFFLINE_AFTER ? "offline" : "reconnecting");
    const wait = RETRY_MS[Math.min(retry.current++, RETRY_MS.length - 1)];
    pause(wait, alive.current.signal).then(() => {
      if (!alive.current.signal.aborted) chatRef.current.resumeStream().catch(show);
    });
  }, [show]);

  /** Read the display for entries written between turns: one read at a time, one more after it. */
  const readSoon = useCallback(async () => {
    if (reading.current.busy) {
      reading.current.again = true;
      return;
    }
    reading.current.busy = true;
    try {
      do {
        reading.current.again = false;
        await readDisplay();
      } while (reading.current.again && !alive.current.signal.aborted);
    } finally {
      reading.current.busy = false;
    }
  }, [readDisplay]);

  // -- the model picker: a queued switch is shown as such until its row says how it went (CE-12) ---

  const settlePick = useCallback((current: string) => {
    setPicked(current);
    model.current.pick = null;
    setModelState("");
  }, []);

  /**
   * Settle the picker from a row of the conversation: a `model` row (a switch landed) or an error
   * row with a model-switch-failed notice, from the watch (`eventId`) or a display read (`old`:
   * only noted). Each row is handled once: one already handled, or whose event id is not after
   * the newest handled, is a retry's copy and must not undo a newer pick (CE-12).
   */
  function settleModel(rowId: string, details: ChatEventDetails, { eventId = null as string | null, old = false }) {
    const notice = details.notice as { code?: string; requested?: ModelIdentity } | undefined;
    const failed = details.kind === "error" && notice?.code === "model-switch-failed";
    if (details.kind !== "model" && !failed) return;
    const seen = model.current;
    const at = eventId == null ? null : position(eventId);
    if (seen.rows.has(rowId) || (at && seen.at && !after(at, seen.at))) return;
    seen.rows.add(rowId);
    if (at) seen.at = at;
    if (old) return;
    const selection = modelName(failed ? notice!.requested! : details.model as ModelIdentity);
    let current = inForceRef.current;
    if (!failed) {
      current = modelName(details.model as ModelIdentity);
      inForceRef.current = current;
      setInForce(current);
    }
    const pick = seen.pick;
    // Before its answer, a row of another selection is an earlier switch's: the answer says how
    // the pick went. Once acknowledged it is the one pick the server waits on, so the next outcome
    // ends it: its own, or that of the pick that superseded it.
    if (pick != null && pick.model !== selection && !pick.acknowledged) return;
    settlePick(current);
    if (failed && pick?.model === selection) setProblem({ text: chatEventWords(details)!.text, code: notice!.code! });
  }
  const inForceRef = useRef("");

  async function switchModel(value: string) {
    const pick = { model: value, acknowledged: false };
    model.current.pick = pick;
    setPicked(value);
    setModelState("switching…");
    const [provider, ...rest] = value.split("/");
    try {
      const answer = await api.switchModel(id, { provider, model_id: rest.join("/") });
      if (model.current.pick !== pick) return;
      if (answer.queued) {
        pick.acknowledged = true;
        setModelState("switches when the turn ends");
      } else {
        inForceRef.current = modelName(answer.model);
        setInForce(inForceRef.current);
        settlePick(inForceRef.current);
      }
    } catch (error) {
      if (model.current.pick !== pick) return;
      settlePick(inForceRef.current);
      show(error);
    }
  }

  // -- opening: the conversation, its display, its watch, the turn in progress -----------------------

  useEffect(() => {
    const controller = new AbortController();
    alive.current = controller;
    (async () => {
      const opened = await api.conversation(id);
      if (controller.signal.aborted) return;
      setInfo(opened);
      inForceRef.current = modelName(opened.model);
      setInForce(inForceRef.current);
      setPicked(inForceRef.current);
      await readDisplay();
      watch(controller.signal);
      follow();
      await readUsage();
    })().catch(show);
    return () => controller.abort();
  }, [id]);

  useEffect(() => {
    const changed = () => setOnline(navigator.onLine);
    window.addEventListener("online", changed);
    window.addEventListener("offline", changed);
    return () => {
      window.removeEventListener("online", changed);
      window.removeEventListener("offline", changed);
    };
  }, []);
  // Shown after a second: a stream taken up again at once (as when a turn pauses for an
  // approval) is no news; connected is shown at once.
  const [connection, setConnection] = useState<Connection>("connecting");
  const reached: Connection = online ? link : "offline";
  useEffect(() => {
    if (reached === "connected") {
      setConnection(reached);
      return;
    }
    const timer = setTimeout(() => setConnection(reached), SETTLE_MS);
    return () => clearTimeout(timer);
  }, [reached]);

  async function watch(signal: AbortSignal) {
    let lastEventId: string | null = null;
    let attempt = 0;
    while (!signal.aborted) {
      let failed = false;
      try {
        const response = await api.events(id, signal, lastEventId);
        setLink("connected");
        attempt = 0;
        for await (const event of serverSentEvents(response)) {
          if (event.id) lastEventId = event.id;
          observe(event.event ?? "message", event.id ?? null, JSON.parse(event.data));
        }
      } catch (error) {
        if (signal.aborted) return;
        if (error instanceof ApiError && error.status !== 503) {
          show(error);
          return;
        }
        failed = true;
      }
      // A watch the server ended (it cut a slow reader, or closed the conversation) is taken up
      // again at once, still connected; a failed one is retried, and says so.
      if (failed) setLink(attempt + 1 >= OFFLINE_AFTER ? "offline" : "reconnecting");
      await pause(failed ? RETRY_MS[Math.min(attempt++, RETRY_MS.length - 1)] : RETRY_MS[0], signal);
    }
  }

  function following(): boolean {
    const current = chatRef.current;
    const last = current.messages.findLast((message) => message.role === "assistant");
    return current.status === "submitted" || current.status === "streaming" || (last != null && waitsForApproval(last));
  }

  function observe(kind: string, eventId: string | null, data: Watched) {
    switch (kind) {
      case "snapshot":
        // `reset`: the watch resumed past what the server's log holds; rows written meanwhile
        // (a switch's outcome among them) are read from the display.
        if (data.reset) readSoon().catch(show);
        if (data.operation?.kind === "run" && !following()) follow();
        return;
      case "approval":
        // Answered (here or in another tab): a stream paused on the call goes on.
        if (data.answer && !streamOpen()) follow();
        return;
      default:
        break;
    }
    if (data.lane !== MAIN_LANE) return; // a delegated agent's lane: its result comes as a row of main's
    switch (data.type) {
      case "run_start":
        if (!following()) readDisplay().then(follow, show);
        break;
      case "chat_event":
        if (data.row) settleModel(data.row.id, data.row.details, { eventId });
        if (!following()) readSoon().catch(show);
        break;
      case "entry_added":
        if (!following()) readSoon().catch(show);
        break;
      default:
        break;
    }
  }

  function streamOpen(): boolean {
    const status = chatRef.current.status;
    return status === "submitted" || status === "streaming";
  }

  // -- composing --------------------------------------------------------------------------------------

  /** Send `text` (and `files`, with a new message only); true when `files` went with it. */
  async function send(text: string, files: FileUIPart[]): Promise<boolean> {
    setProblem(null);
    if (text.startsWith("/") && !text.startsWith("//")) {
      const before = new Set(rowsRef.current.filter(isCommandRow).map((row) => row.id));
      try {
        await api.command(id, text);
      } catch (error) {
        // A command that failed as it ran is recorded as its row, which says why, as in the
        // terminal; one refused before it ran (an unknown name) is the composer's problem.
        if (!(error instanceof ApiError) || !(await failureRecorded(text, before))) throw error;
      }
      shared.changed();
      return false;
    }
    if (following()) {
      await (delivery === "steer" ? api.steer(id, text) : api.followUp(id, text));
      return false;
    }
    setResumed(false);
    await chat.sendMessage(files.length > 0 ? { text, files } : { text });
    return true;
  }

  function submit(event?: FormEvent) {
    event?.preventDefault();
    const text = draft;
    const files = attachments;
    if (!text.trim() && (files.length === 0 || following())) return;
    setDraft("");
    setAttachments([]);
    send(text, files).then((took) => {
      if (!took && files.length > 0) setAttachments((now) => [...files, ...now]);
    }, (error) => {
      setDraft(text);
      setAttachments((now) => [...files, ...now]);
      show(error);
    });
  }

  /** Whether the display now shows a failed command row for `line`'s command that was not among
   * the rows `before`. */
  async function failureRecorded(line: string, before: Set<string>): Promise<boolean> {
    const name = line.slice(1).split(/\s/, 1)[0];
    const page = await readDisplay();
    return page != null && page.rows.some((row) => isCommandRow(row) && !before.has(row.id) &&
      row.details.name === name && row.details.error != null);
  }

  /** Attach the images among `files` (pasted, dropped or picked); anything else is refused. */
  function attach(files: Iterable<File>) {
    for (const file of files) {
      if (!file.type.startsWith("image/")) {
        setProblem({ text: `${file.name || "that file"} is not an image`, code: "" });
      } else if (file.size > MAX_IMAGE_BYTES) {
        setProblem({ text: `${file.name || "that image"} is larger than 5 MiB`, code: "" });
      } else {
        dataUrl(file).then((url) => setAttachments((now) => [...now,
          { type: "file", mediaType: file.type, filename: file.name || undefined, url }]), show);
      }
    }
  }

  function pasted(event: ClipboardEvent<HTMLTextAreaElement>) {
    const files = [...event.clipboardData.files];
    if (files.length === 0) return;
    event.preventDefault();
    attach(files);
  }

  function dropped(event: DragEvent<HTMLElement>) {
    if (event.dataTransfer.files.length === 0) return;
    event.preventDefault();
    attach(event.dataTransfer.files);
  }

  async function stop() {
    await api.stop(id);
  }

  const completions = useMemo(() => {
    const typed = draft.match(/^\/(\S*)$/);
    if (!typed) return [];
    return shared.commands.filter((command) => command.name.startsWith(typed[1]));
  }, [draft, shared.commands]);

  function keyDown(event: KeyboardEvent<HTMLTextAreaElement>) {
    if (event.key === "Tab" && completions.length > 0) {
      event.preventDefault();
      setDraft(`/${completions[0].name} `);
    } else if (event.key === "Enter" && !event.shiftKey && !event.nativeEvent.isComposing) {
      event.preventDefault();
      submit();
    }
  }

  useEffect(() => {
    const onKey = (event: globalThis.KeyboardEvent) => {
      if (event.key === "Escape" && running) stop().catch(show);
    };
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  });

  // -- drawing ----------------------------------------------------------------------------------------

  const actions: RowActions = useMemo(() => ({
    approve: (row, approved) => {
      if (row.approvalId) {
        Promise.resolve(chatRef.current.addToolApprovalResponse({ id: row.approvalId, approved })).catch(show);
      }
    },
    image: (ref) => api.image(id, ref).then((blob) => URL.createObjectURL(blob)),
    promptImage: (entryId, index) => api.promptImage(id, entryId, index).then((blob) => URL.createObjectURL(blob)),
  }), [id, show]);

  const shown = useMemo(() => {
    const journal = displayRows(rows);
    if (liveMessage == null) return { journal, live: chat.messages.map(userRowOf).filter((row) => row != null) };
    const live = chat.messages.flatMap((message) => message.role === "assistant" ?
      liveRows(message, streaming) : [userRowOf(message)].filter((row) => row != null));
    const liveIds = new Set(live.filter((row) => row.kind !== "tool" && row.kind !== "assistant").map((row) => row.id));
    let cut = journal.length;
    if (resumed) {
      const prompt = journal.findLastIndex((row) => row.kind === "user" && !liveIds.has(row.id));
      cut = prompt + 1;
    }
    return { journal: journal.filter((row, index) => index < cut && !liveIds.has(row.id)), live };
  }, [rows, chat.messages, liveMessage, resumed, streaming]);

  const transcript = useRef<HTMLElement>(null);
  const atEnd = useRef(true);
  useEffect(() => {
    const box = transcript.current;
    if (box && atEnd.current) box.scrollTop = box.scrollHeight;
  });

  // -- a long conversation: older pages are read as the person scrolls back, the rows in view kept
  // where they are; the rows drawn already are not drawn again (RowView is memoized) ----------------

  const readingOlder = useRef(false);
  const keptFromEnd = useRef<number | null>(null);
  const olderMark = useRef<HTMLButtonElement>(null);

  async function older() {
    if (nextBefore == null || readingOlder.current) return;
    readingOlder.current = true;
    try {
      const page = await api.display(id, nextBefore);
      if (alive.current.signal.aborted) return;
      const box = transcript.current;
      if (box) keptFromEnd.current = box.scrollHeight - box.scrollTop;
      setRows((current) => [...page.rows, ...current]);
      setNextBefore(page.next_before);
    } finally {
      readingOlder.current = false;
    }
  }

  useLayoutEffect(() => {
    const box = transcript.current;
    if (box && keptFromEnd.current != null) {
      box.scrollTop = box.scrollHeight - keptFromEnd.current;
      keptFromEnd.current = null;
    }
  });

  // Observed anew for each page, so a page too short to scroll reads the next one too.
  useEffect(() => {
    const mark = olderMark.current;
    const box = transcript.current;
    if (mark == null || box == null) return;
    const near = new IntersectionObserver((seen) => {
      if (seen.some((entry) => entry.isIntersecting)) older().catch(show);
    }, { root: box, rootMargin: "800px 0px 0px 0px" });
    near.observe(mark);
    return () => near.disconnect();
  }, [nextBefore]);

  const title = name ?? "New conversation";
  const empty = shown.journal.length === 0 && shown.live.length === 0;
  return (
    <main id="conversation" data-running={running ? "true" : "false"} onDrop={dropped}
      onDragOver={(event) => { if (event.dataTransfer.types.includes("Files")) event.preventDefault(); }}>
      <header>
        {menu}
        <h1 id="title" title={title}>{title}</h1>
        <span id="connection" data-state={connection} role="status">{CONNECTION_WORDS[connection]}</span>
        {spent && (
          <span id="usage" title={`input ${spent.input.toLocaleString("en-US")}, output ${
            spent.output.toLocaleString("en-US")}, cache read ${spent.cache_read.toLocaleString("en-US")}, cache written ${
            spent.cache_write.toLocaleString("en-US")} tokens`}>{spentWords(spent)}</span>
        )}
        <div className="pickers">
          {shared.projects.length > 0 && (
            <select id="project" aria-label="Project" value="" onChange={(event) => {
              if (event.target.value) api.selectProject(id, event.target.value).then(() => readSoon(), show);
            }}>
              <option value="">Project…</option>
              {shared.projects.map((project) => (
                <option key={project.execution_ref} value={project.execution_ref}>{project.slug}</option>
              ))}
            </select>
          )}
          <select id="model" aria-label="Model" value={picked} data-current={inForce}
            onChange={(event) => switchModel(event.target.value)}>
            {[...shared.models.map((m) => [modelName(m), m.name] as const),
              ...(inForce && !shared.models.some((m) => modelName(m) === inForce) ? [[inForce, inForce] as const] : [])]
              .map(([value, label]) => <option key={value} value={value}>{label}</option>)}
          </select>
          <span id="model-state" role="status">{modelState}</span>
        </div>
      </header>
      <section id="transcript" ref={transcript} aria-live="polite" onScroll={(event) => {
        const box = event.currentTarget;
        atEnd.current = box.scrollHeight - box.scrollTop - box.clientHeight < 48;
      }}>
        {nextBefore && <button id="older" ref={olderMark} type="button" onClick={() => older().catch(show)}>
          Older messages</button>}
        {empty && info && <div className="empty"><p>Ask anything, or type <kbd>/</kbd> for commands.</p></div>}
        {shown.journal.map((row) => <RowView key={row.key} row={row} live={false} actions={actions} />)}
        {shown.live.map((row) => <RowView key={`live:${row.key}`} row={row} live actions={actions} />)}
      </section>
      {problem && <p id="error" role="alert" data-code={problem.code}>{problem.text}</p>}
      <form id="composer" onSubmit={submit}>
        {completions.length > 0 && (
          <ul id="commands" role="listbox" aria-label="Commands">
            {completions.map((command) => (
              <li key={command.name} role="option" aria-selected={false}
                onMouseDown={(event) => { event.preventDefault(); setDraft(`/${command.name} `); }}>
                <code>{command.usage}</code> <span>{command.summary}</span>
              </li>
            ))}
          </ul>
        )}
        {attachments.length > 0 && (
          <ul id="attachments" aria-label="Attached images">
            {attachments.map((file, index) => (
              <li key={index}>
                <img src={file.url} alt={file.filename ?? "attached image"} />
                <button type="button" aria-label="Remove image" title="Remove"
                  onClick={() => setAttachments((now) => now.filter((_, at) => at !== index))}>×</button>
              </li>
            ))}
          </ul>
        )}
        <textarea id="prompt" rows={2} placeholder={running ? "Steer the turn, or queue a follow-up" : "Message"}
          aria-label="Message" value={draft} onChange={(event) => setDraft(event.target.value)} onKeyDown={keyDown}
          onPaste={pasted} />
        <div className="actions">
          <label id="attach" title="Attach images (or paste or drop them)">
            <svg aria-hidden="true" viewBox="0 0 24 24" width="16" height="16" fill="none" stroke="currentColor"
              strokeWidth="2" strokeLinecap="round" strokeLinejoin="round">
              <path d="m21 11-8.6 8.6a5 5 0 0 1-7-7L14 4a3.3 3.3 0 0 1 4.7 4.7l-8.6 8.6a1.7 1.7 0 0 1-2.4-2.4L15.6 7" />
            </svg>
            <span className="label">Image</span>
            <input id="attach-input" type="file" accept="image/png,image/jpeg,image/gif,image/webp" multiple
              onChange={(event) => {
                attach(event.target.files ?? []);
                event.target.value = "";
              }} />
          </label>
          <label id="while-running" hidden={!running}>While it runs{" "}
            <select id="delivery" aria-label="While it runs" value={delivery}
              onChange={(event) => setDelivery(event.target.value as "steer" | "follow-up")}>
              <option value="steer">steer (read after its current tool calls)</option>
              <option value="follow-up">follow up (read when it would stop)</option>
            </select>
          </label>
          <button id="stop" type="button" title="Stop (Esc)" hidden={!running} onClick={() => stop().catch(show)}>
            Stop
          </button>
          <button id="send" type="submit">{running ? "Send while it runs" : "Send"}</button>
        </div>
      </form>
    </main>
  );
}

function isCommandRow(row: DisplayRow): row is Extract<DisplayRow, { kind: "event" }> {
  return row.kind === "event" && row.details.kind === "command";
}

function waitsForApproval(message: UIMessage): boolean {
  return message.parts.some((part) => "state" in part && part.state === "approval-requested");
}

function userRowOf(message: UIMessage): Row | null {
  if (message.role !== "user") return null;
  const text = message.parts.flatMap((part) => (part.type === "text" ? [part.text] : [])).join("\n\n");
  const sources = message.parts.flatMap((part) => (part.type === "file" ? [part.url] : []));
  return { kind: "user", key: message.id, id: message.id, text, images: sources.length, sources, pending: true };
}
