// The server as the page reaches it: the bearer token, JSON requests with their typed errors, and
// the one Server-Sent Events reader both streams use (the AI SDK UI message stream and the native
// watch). fetch, not EventSource: EventSource cannot send an Authorization header.

const TOKEN_KEY = "harness.token";

/** An error the server answered with: its HTTP status and the stable `{code, message, details}`. */
export class ApiError extends Error {
  constructor(status, body) {
    super(typeof body.message === "string" ? body.message : `HTTP ${status}`);
    this.status = status;
    this.code = typeof body.code === "string" ? body.code : "http_error";
    this.details = body.details ?? {};
  }
}

export function setToken(token) {
  localStorage.setItem(TOKEN_KEY, token);
}

function headers(json) {
  const result = {};
  const token = localStorage.getItem(TOKEN_KEY);
  if (token) result.Authorization = `Bearer ${token}`;
  if (json) result["Content-Type"] = "application/json";
  return result;
}

/** `fetch` with the token, a JSON body when `body` is given, and `ApiError` for any status >= 400. */
export async function request(method, path, { body, signal, lastEventId } = {}) {
  const init = { method, headers: headers(body !== undefined), signal };
  if (body !== undefined) init.body = JSON.stringify(body);
  if (lastEventId != null) init.headers["Last-Event-ID"] = lastEventId;
  const response = await fetch(path, init);
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

/** The JSON the route answers with, or null for 204. */
export async function json(method, path, body) {
  const response = await request(method, path, { body });
  return response.status === 204 ? null : response.json();
}

/**
 * The events of a `text/event-stream` response as `{event, id, data}` (data lines joined by "\n"),
 * in order; comments (heartbeats) are skipped. Ends when the server closes the stream; a dropped
 * connection rejects, which the caller answers by reconnecting.
 */
export async function* serverSentEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  let event = "message";
  let id = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    // A lone "\r" at the end may be the first half of "\r\n": keep it for the next chunk.
    const lines = buffer.split(/\r\n|\n|\r(?!$)/);
    buffer = lines.pop();
    for (const line of lines) {
      if (line === "") {
        if (data.length > 0) yield { event, id, data: data.join("\n") };
        data = [];
        event = "message";
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? "" : line.slice(colon + 1);
      if (text.startsWith(" ")) text = text.slice(1);
      if (field === "data") data.push(text);
      else if (field === "event") event = text;
      else if (field === "id") id = text;
    }
  }
}
