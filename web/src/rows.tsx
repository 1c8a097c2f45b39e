// The transcript's rows: those of the display read (the journal's), and those of the turn streaming
// now, drawn from `useChat`'s assistant message. Both become the same `Row`s, drawn by the same
// components, so a turn looks the same live and after a reload.
//
// Keys: a tool call's card is keyed by the reply that made it and its call id (a live one by its
// message, step and call id), never by the call id alone: some providers send `call_1` on every
// turn, and two turns' cards must stay two cards, each in its place.

import { getToolName, isToolUIPart, type UIMessage } from "ai";
import { createTwoFilesPatch } from "diff";
import { memo, useEffect, useState } from "react";
import type { BlocksRow, ChatEventDetails, DelegationFinish, DisplayRow, MessageBlock } from "./api";
import { languageOf, Markdown } from "./markdown";
import { chatEventWords, delegationWords } from "./words";

export type ToolState = "input" | "running" | "approval" | "done" | "failed" | "denied";

export type Row =
  | { kind: "user"; key: string; id: string; text: string; images: number; pending?: boolean; sources?: string[] }
  | { kind: "assistant"; key: string; id: string; text: string; thinking: string; error: string | null;
      streaming?: boolean; blocks?: MessageBlock[] }
  | { kind: "tool"; key: string; id: string; name: string; input: unknown; state: ToolState; output: string | null;
      approvalId?: string }
  | { kind: "event"; key: string; id: string; details: ChatEventDetails }
  | { kind: "delegation"; key: string; id: string; finish: DelegationFinish }
  | { kind: "message"; key: string; id: string; sender: string; text: string }
  | { kind: "blocks"; key: string; id: string; blocks: MessageBlock[] };

/** The rows of a display read, oldest first. A reply's blocks go under the reply when it is shown. */
export function displayRows(rows: DisplayRow[]): Row[] {
  const shown: Row[] = [];
  const replies = new Map<string, Extract<Row, { kind: "assistant" }>>();
  const blocksOf = (blocks: BlocksRow) => {
    const reply = blocks.assistant_id ? replies.get(blocks.assistant_id) : undefined;
    if (reply) reply.blocks = blocks.blocks;
    else shown.push({ kind: "blocks", key: blocks.id, id: blocks.id, blocks: blocks.blocks });
  };
  for (const row of rows) {
    switch (row.kind) {
      case "user":
        shown.push({ kind: "user", key: row.id, id: row.id, text: row.text, images: row.image_count });
        break;
      case "assistant": {
        // A stopped reply's error ("the request was aborted") is the stop itself, which its
        // interrupted row tells: one row for a stop.
        const error = row.stop_reason === "aborted" ? null : row.error_message;
        const reply = { kind: "assistant" as const, key: row.id, id: row.id, text: row.text, thinking: row.thinking,
          error };
        replies.set(row.id, reply);
        shown.push(reply);
        if (row.blocks) blocksOf(row.blocks);
        break;
      }
      case "tool":
        shown.push({ kind: "tool", key: `${row.assistant_id ?? row.result?.id}:${row.id}`, id: row.id,
          name: row.tool_name, input: row.arguments,
          state: row.result == null ? "running" : row.result.is_error ? "failed" : "done",
          output: row.result?.text ?? null });
        break;
      case "event":
        shown.push({ kind: "event", key: row.id, id: row.id, details: row.details });
        break;
      case "delegation":
        shown.push({ kind: "delegation", key: row.id, id: row.id, finish: row.finish });
        break;
      case "message":
        shown.push({ kind: "message", key: row.id, id: row.id, sender: row.sender, text: row.text });
        break;
      case "blocks":
        blocksOf(row);
        break;
      default:
        console.error("a display row this page does not know", row);
    }
  }
  return shown;
}

const TOOL_STATES: Record<string, ToolState> = {
  "input-streaming": "input", "input-available": "running", "approval-requested": "approval",
  "approval-responded": "running", "output-available": "done", "output-error": "failed", "output-denied": "denied",
};

/** The rows of a streaming (or paused) assistant message: per step its reasoning and text as one
 * reply, then its tool cards, with the rows the run published (events, blocks, steers) in place. */
export function liveRows(message: UIMessage, streaming: boolean): Row[] {
  const shown: Row[] = [];
  let step = 0;
  let reply: Extract<Row, { kind: "assistant" }> | null = null;
  const replyOfStep = () => {
    if (reply == null) {
      reply = { kind: "assistant", key: `${message.id}:${step}`, id: `${message.id}:${step}`, text: "", thinking: "",
        error: null, streaming };
      shown.push(reply);
    }
    return reply;
  };
  for (const part of message.parts) {
    if (part.type === "step-start") {
      step += 1;
      reply = null;
    } else if (part.type === "text") {
      const row = replyOfStep();
      row.text = row.text ? `${row.text}\n${part.text}` : part.text;
    } else if (part.type === "reasoning") {
      const row = replyOfStep();
      row.thinking = row.thinking ? `${row.thinking}\n${part.text}` : part.text;
    } else if (isToolUIPart(part)) {
      shown.push({ kind: "tool", key: `${message.id}:${step}:${part.toolCallId}`, id: part.toolCallId,
        name: getToolName(part), input: part.input, state: TOOL_STATES[part.state],
        output: part.state === "output-available" ? shown_(part.output) : part.state === "output-error" ?
          part.errorText : null,
        approvalId: part.state === "approval-requested" ? part.approval.id : undefined });
    } else if (part.type === "data-chat-event") {
      const data = part.data as { id: string; details: ChatEventDetails };
      shown.push({ kind: "event", key: data.id, id: data.id, details: data.details });
      reply = null;
    } else if (part.type === "data-message-blocks") {
      const data = part.data as BlocksRow;
      shown.push({ kind: "blocks", key: data.id, id: data.id, blocks: data.blocks });
    } else if (part.type === "data-delegation") {
      const data = part.data as { id: string; finish: DelegationFinish };
      shown.push({ kind: "delegation", key: data.id, id: data.id, finish: data.finish });
    } else if (part.type === "data-sender-message") {
      const data = part.data as { id: string; sender: string; text: string };
      shown.push({ kind: "message", key: data.id, id: data.id, sender: data.sender, text: data.text });
    } else if (part.type === "steering-message") {
      const text = part.parts.flatMap((p) => (p.type === "text" ? [p.text] : [])).join("\n\n");
      shown.push({ kind: "user", key: part.id, id: part.id, text, images: 0 });
      reply = null;
    }
  }
  return shown;
}

function shown_(value: unknown): string {
  if (value == null) return "";
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

// -- drawing --------------------------------------------------------------------------------------

const TOOL_STATUS: Record<ToolState, string> = {
  input: "preparing…", running: "running…", approval: "needs your approval", done: "done", failed: "failed",
  denied: "denied",
};

export interface RowActions {
  /** Answer a call's approval request. */
  approve: (row: Extract<Row, { kind: "tool" }>, approved: boolean) => void;
  /** A URL to show a blocks' image from. */
  image: (ref: string) => Promise<string>;
  /** A URL to show image `index` of the person's message `entryId` from. */
  promptImage: (entryId: string, index: number) => Promise<string>;
}

interface RowProps {
  row: Row;
  live: boolean;
  actions: RowActions;
}

/** Whether two rows show the same: their fields are the same values (nested ones are the display
 * read's own objects, kept as long as their rows are). */
function sameRow(a: Row, b: Row): boolean {
  const keys = Object.keys(a) as (keyof Row)[];
  return keys.length === Object.keys(b).length && keys.every((key) => Object.is(a[key], b[key]));
}

/** A row, drawn again only when it changed: a long conversation's rows are not redrawn for each
 * key typed or each page read. */
export const RowView = memo(RowOf, (before, after) =>
  before.live === after.live && before.actions === after.actions && sameRow(before.row, after.row));

function RowOf({ row, live, actions }: RowProps) {
  const common = { "data-id": row.id, "data-live": live ? "" : undefined };
  switch (row.kind) {
    case "user":
      return (
        <div className={`row user${row.pending ? " pending" : ""}`} {...common}>
          {row.images > 0 && (
            <div className="images" aria-label={`${row.images} image${row.images === 1 ? "" : "s"} attached`}>
              {row.sources ? row.sources.map((url, index) => <img key={index} src={url} alt="attached image" />) :
                Array.from({ length: row.images }, (_, index) => (
                  <Loaded key={index} load={() => actions.promptImage(row.id, index)} alt="attached image" />
                ))}
            </div>
          )}
          {row.text && <p className="text">{row.text}</p>}
        </div>
      );
    case "assistant":
      if (!row.text && !row.thinking && !row.error && !row.blocks) return null;
      return (
        <div className="row assistant" data-state={row.streaming ? "streaming" : undefined} {...common}>
          {row.thinking && (
            <details className="thinking">
              <summary>Thinking</summary>
              <div className="text">{row.thinking}</div>
            </details>
          )}
          {row.text && <Markdown text={row.text} streaming={row.streaming} />}
          {row.error && <p className="error">{row.error}</p>}
          {row.blocks && <Cards blocks={row.blocks} image={actions.image} />}
        </div>
      );
    case "tool":
      return <ToolCard row={row} common={common} approve={actions.approve} />;
    case "event": {
      const words = chatEventWords(row.details);
      if (words == null) return null;
      return <div className="row event" data-tone={words.tone} data-kind={row.details.kind} {...common}>{words.text}</div>;
    }
    case "delegation": {
      const words = delegationWords(row.finish);
      return <div className="row event delegation" data-tone={words.tone} {...common}>{words.text}</div>;
    }
    case "message":
      return (
        <div className="row sender" {...common}>
          <span className="from">{row.sender === "garden" ? "from the garden" : `from ${row.sender}`}</span>
          <Markdown text={row.text} />
        </div>
      );
    case "blocks":
      return <div className="row" {...common}><Cards blocks={row.blocks} image={actions.image} /></div>;
  }
}

/** What a `write` or `edit` call writes, as the terminal shows it: a new file's content, or the
 * edit as a diff (of the text it replaces; the page cannot read the file). */
function change(name: string, input: unknown): string | null {
  if (input == null || typeof input !== "object") return null;
  const args = input as Record<string, unknown>;
  const path = typeof args.path === "string" ? args.path : null;
  if (path == null) return null;
  if (name === "write" && typeof args.content === "string") {
    return `\`\`\`${languageOf(path)}\n${args.content}\n\`\`\``;
  }
  if (name === "edit" && typeof args.old_text === "string" && typeof args.new_text === "string") {
    const patch = createTwoFilesPatch(path, path, args.old_text, args.new_text, "", "", { context: 3 });
    return `\`\`\`diff\n${patch.split("\n").slice(2).join("\n").trimEnd()}\n\`\`\``;
  }
  return null;
}

function ToolCard({ row, common, approve }: { row: Extract<Row, { kind: "tool" }>; common: object;
  approve: RowActions["approve"] }) {
  const [answered, setAnswered] = useState(false);
  const shownChange = change(row.name, row.input);
  const path = row.input && typeof row.input === "object" ? (row.input as Record<string, unknown>).path : undefined;
  const waiting = row.state === "approval";
  return (
    <div className="row tool" data-state={row.state} {...common}>
      <div className="head">
        <span className="name">{row.name}</span>
        {typeof path === "string" && <span className="path">{path}</span>}
        <span className="status">{TOOL_STATUS[row.state]}</span>
      </div>
      <details className="body" open={waiting || undefined}>
        <summary>{shownChange ? (row.name === "edit" ? "diff" : "content") : "input"}</summary>
        {shownChange ? <Markdown text={shownChange} /> : <pre className="input">{shown_(row.input)}</pre>}
      </details>
      {row.output != null && row.output !== "" && <pre className="output">{row.output}</pre>}
      {waiting && (
        <div className="approval">
          <button type="button" className="approve" disabled={answered}
            onClick={() => { setAnswered(true); approve(row, true); }}>Approve</button>
          <button type="button" className="deny" disabled={answered}
            onClick={() => { setAnswered(true); approve(row, false); }}>Deny</button>
        </div>
      )}
    </div>
  );
}

function Cards({ blocks, image }: { blocks: MessageBlock[]; image: RowActions["image"] }) {
  return (
    <div className="blocks">
      {blocks.map((block, index) => (
        <article className="card" key={index}>
          {block.image && <Loaded key={block.image.ref} load={() => image(block.image!.ref)} alt={block.title} />}
          <h3>{block.link ? <a href={block.link} rel="noopener noreferrer" target="_blank">{block.title}</a> :
            block.title}</h3>
          <p>{block.text}</p>
        </article>
      ))}
    </div>
  );
}

/** An image the server serves behind the token: read once, shown from an object URL. */
function Loaded({ load, alt }: { load: () => Promise<string>; alt: string }) {
  const [url, setUrl] = useState<string>();
  useEffect(() => {
    let gone = false;
    let loaded: string | undefined;
    load().then((made) => {
      loaded = made;
      if (gone) URL.revokeObjectURL(made);
      else setUrl(made);
    }, (error) => console.error(error));
    return () => {
      gone = true;
      if (loaded) URL.revokeObjectURL(loaded);
    };
  }, []); // one image a mount: its key names it
  return url ? <img src={url} alt={alt} /> : null;
}
