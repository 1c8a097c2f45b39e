// The server as the page reaches it, every route but the AI SDK chat door (which `useChat` speaks,
// through `authorizedFetch`): the bearer token, JSON requests with their typed errors, the shapes
// the routes answer with, and the Server-Sent Events reader of the native watch. fetch, not
// EventSource: EventSource cannot send an Authorization header.

import { type EventSourceMessage, EventSourceParserStream } from "eventsource-parser/stream";

const TOKEN_KEY = "harness.token";

/** An error the server answered with: its HTTP status and the stable `{code, message, details}`. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly details: Record<string, unknown>;

  constructor(status: number, body: { code?: unknown; message?: unknown; details?: unknown }) {
    super(typeof body.message === "string" ? body.message : `HTTP ${status}`);
    this.status = status;
    this.code = typeof body.code === "string" ? body.code : "http_error";
    this.details = (body.details as Record<string, unknown> | undefined) ?? {};
  }
}

// -- the shapes of the routes' answers (docs/contract.md and /docs) -------------------------------

export interface ModelIdentity {
  provider: string;
  model_id: string;
}

/** A conversation as the listing shows it; times are Unix ms. */
export interface ConversationInfo {
  id: string;
  name: string | null;
  created_at: number;
  updated_at: number;
}

export interface ConversationView extends ConversationInfo {
  model: ModelIdentity;
}

export interface ModelInfo extends ModelIdentity {
  name: string;
  context_window: number;
  key_present: boolean;
}

export interface Project {
  id: number;
  slug: string;
  path: string;
  icon: string | null;
  execution_ref: string;
}

/** A command the server's command route runs, as `/help` lists it. */
export interface CommandInfo {
  name: string;
  usage: string;
  summary: string;
}

/** What a conversation has spent: tokens by kind and their cost in US dollars. */
export interface Usage {
  input: number;
  output: number;
  cache_read: number;
  cache_write: number;
  total_tokens: number;
  cost: { input: number; output: number; cache_read: number; cache_write: number; total: number };
}

export interface ModelSwitch {
  model: ModelIdentity;
  queued: boolean;
  tools: string[] | null;
}

/** A garden as its owner lists it; `created_at` is Unix ms. */
export interface GardenInfo {
  name: string;
  gardener_model: ModelIdentity;
  created_at: number;
  active_goals: number;
}

export type GoalAction = "pause" | "resume" | "drop" | "conclude";

/** A garden's goal; times are Unix ms. */
export interface Goal {
  id: string;
  type: "tend" | "durable";
  text: string;
  status: "active" | "paused" | "dropped" | "done";
  every_s: number | null;
  created_at: number;
  last_run_at: number | null;
}

export interface InboxFile {
  name: string;
  text: string;
  size: number;
  truncated: boolean;
}

/** A garden's inbox: its replies in conversations and, apart, its notes; newest first. */
export interface Inbox {
  replies: InboxFile[];
  notes: InboxFile[];
  more: boolean;
}

/** A chat event's typed details (CE-2); `kind` picks the shape, which `words.ts` reads. */
export type ChatEventDetails = { kind: string } & Record<string, unknown>;

export interface MessageBlock {
  title: string;
  text: string;
  link: string | null;
  image: { ref: string } | null;
}

export interface BlocksRow {
  kind: "blocks";
  id: string;
  assistant_id: string | null;
  blocks: MessageBlock[];
}

export interface DelegationFinish {
  kind: "agent" | "workflow";
  outcome: "completed" | "failed" | "aborted";
  agent?: string;
  task?: string;
  title?: string;
  tally?: { completed: number; failed: number; aborted: number };
}

export type DisplayRow =
  | { kind: "user"; id: string; text: string; image_count: number; timestamp: number }
  | { kind: "assistant"; id: string; text: string; thinking: string; stop_reason: string; model: string;
      error_message: string | null; blocks: BlocksRow | null; timestamp: number }
  | { kind: "tool"; id: string; tool_name: string; assistant_id: string | null;
      arguments: Record<string, unknown> | null; result: { id: string; text: string; is_error: boolean } | null }
  | { kind: "event"; id: string; details: ChatEventDetails }
  | { kind: "delegation"; id: string; finish: DelegationFinish }
  | { kind: "message"; id: string; sender: string; custom_type: string; text: string; timestamp: number }
  | BlocksRow;

export interface DisplayPage {
  rows: DisplayRow[];
  next_before: string | null;
}

// -- signing in -----------------------------------------------------------------------------------

let askForToken: () => Promise<string> = () => Promise.reject(new Error("this server asks for a token"));

/** How a 401 gets a token: the page's sign-in dialog; the request is sent again with it. */
export function onSignIn(ask: () => Promise<string>): void {
  askForToken = ask;
}

function withToken(init: RequestInit = {}): RequestInit {
  const headers = new Headers(init.headers);
  const token = localStorage.getItem(TOKEN_KEY);
  if (token) headers.set("Authorization", `Bearer ${token}`);
  return { ...init, headers };
}

/** `fetch` with the bearer token; a 401 asks for a token and sends the request again. */
export async function authorizedFetch(input: RequestInfo | URL, init?: RequestInit): Promise<Response> {
  for (;;) {
    const response = await fetch(input, withToken(init));
    if (response.status !== 401) return response;
    localStorage.setItem(TOKEN_KEY, (await askForToken()).trim());
  }
}

// -- requests -------------------------------------------------------------------------------------

interface Options {
  body?: unknown;
  signal?: AbortSignal;
  lastEventId?: string | null;
}

/** The response of `method path`, or `ApiError` for any status >= 400. */
async function request(method: string, path: string, { body, signal, lastEventId }: Options = {}): Promise<Response> {
  const headers: Record<string, string> = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (lastEventId != null) headers["Last-Event-ID"] = lastEventId;
  const response = await authorizedFetch(path, {
    method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status >= 400) {
    let parsed = {};
    try {
      parsed = await response.json();
    } catch {
      // a body that is not JSON: the status alone says what happened
    }
    throw new ApiError(response.status, parsed);
  }
  return response;
}

async function json<T>(method: string, path: string, body?: unknown): Promise<T> {
  const response = await request(method, path, { body });
  return (response.status === 204 ? null : await response.json()) as T;
}

const of = (id: string) => `/api/conversations/${encodeURIComponent(id)}`;

/** Every route of the server the page uses besides the chat door. */
export const api = {
  conversations: () => json<ConversationInfo[]>("GET", "/api/conversations"),
  create: () => json<ConversationInfo>("POST", "/api/conversations", {}),
  conversation: (id: string) => json<ConversationView>("GET", of(id)),
  rename: (id: string, name: string | null) => json<ConversationInfo>("PATCH", of(id), { name }),
  remove: (id: string) => json<null>("DELETE", of(id)),
  models: () => json<ModelInfo[]>("GET", "/api/models"),
  projects: () => json<Project[]>("GET", "/api/projects"),
  commands: () => json<CommandInfo[]>("GET", "/api/commands"),
  display: (id: string, before: string | null = null) =>
    json<DisplayPage>("GET", `${of(id)}/display${before ? `?before=${encodeURIComponent(before)}` : ""}`),
  image: async (id: string, ref: string) =>
    (await request("GET", `${of(id)}/images/${encodeURIComponent(ref)}`)).blob(),
  promptImage: async (id: string, entryId: string, index: number) =>
    (await request("GET", `${of(id)}/messages/${encodeURIComponent(entryId)}/images/${index}`)).blob(),
  usage: (id: string) => json<Usage>("GET", `${of(id)}/usage`),
  switchModel: (id: string, model: ModelIdentity) => json<ModelSwitch>("PUT", `${of(id)}/model`, { model }),
  selectProject: (id: string, executionRef: string) =>
    json<ChatEventDetails>("PUT", `${of(id)}/project`, { execution_ref: executionRef }),
  command: (id: string, line: string) => json<unknown>("POST", `${of(id)}/command`, { line }),
  steer: (id: string, text: string) => json<unknown>("POST", `${of(id)}/steer`, { text }),
  followUp: (id: string, text: string) => json<unknown>("POST", `${of(id)}/follow-up`, { text }),
  stop: (id: string) => json<unknown>("POST", `/api/chat/${encodeURIComponent(id)}/stop`),
  gardens: () => json<GardenInfo[]>("GET", "/api/gardens"),
  goals: (garden: string) => json<Goal[]>("GET", `/api/gardens/${encodeURIComponent(garden)}/goals`),
  inbox: (garden: string) => json<Inbox>("GET", `/api/gardens/${encodeURIComponent(garden)}/inbox`),
  goalAction: (garden: string, goalId: string, action: GoalAction) =>
    json<Goal>("POST", `/api/gardens/${encodeURIComponent(garden)}/goals/${encodeURIComponent(goalId)}/action`,
      { action }),
  events: (id: string, signal: AbortSignal, lastEventId: string | null) =>
    request("GET", `${of(id)}/events`, { signal, lastEventId }),
};

export function modelName(model: ModelIdentity): string {
  return `${model.provider}/${model.model_id}`;
}

// -- the native watch's events ----------------------------------------------------------------------

/** The events of a `text/event-stream` response, in order (heartbeat comments skipped). Ends when
 * the server closes the stream; a dropped connection rejects, which the caller answers by
 * reconnecting. */
export async function* serverSentEvents(response: Response): AsyncGenerator<EventSourceMessage> {
  const reader = response.body!.pipeThrough(new TextDecoderStream()).pipeThrough(new EventSourceParserStream())
    .getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    yield value;
  }
}
