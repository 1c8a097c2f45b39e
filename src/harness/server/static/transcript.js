// The conversation view: the rows of the display read, and the streaming turn drawn from the AI SDK
// UI message stream's parts. A row is keyed by the id both sources give it (an entry id, a tool
// call id, a chat-event row id), so a part that repeats a row already shown updates that row: a
// resumed stream, which replays the turn from its start, never draws anything twice.
//
// Every word the model or a tool wrote is set with textContent, never parsed as HTML.

import { chatEventWords, delegationWords } from "./words.js";

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text != null) node.textContent = text;
  return node;
}

function shown(value) {
  if (value == null) return "";
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

const TOOL_STATUS = {
  input: "preparing…",
  running: "running…",
  approval: "needs your approval",
  done: "done",
  failed: "failed",
  denied: "denied",
};

export class Transcript {
  /**
   * `container`: the element the rows go in. `onApproval({toolCallId, approvalId, approved})`
   * answers an approval request; `loadImage(ref)` resolves to a URL a message block's image can
   * be shown from.
   */
  constructor(container, { onApproval, loadImage }) {
    this.container = container;
    this.onApproval = onApproval;
    this.loadImage = loadImage;
    this.tools = new Map();
    this.live = null;
    this.pendingCount = 0;
    // Follow the newest row while the person is at the end; one who scrolled up to read stays put.
    this.atEnd = true;
    container.addEventListener("scroll", () => {
      this.atEnd = container.scrollHeight - container.scrollTop - container.clientHeight < 48;
    });
    new MutationObserver(() => {
      if (this.atEnd) container.scrollTop = container.scrollHeight;
    }).observe(container, { childList: true, subtree: true, characterData: true });
  }

  clear() {
    this.container.replaceChildren();
    this.tools.clear();
    this.live = null;
  }

  find(id) {
    return this.container.querySelector(`[data-id="${CSS.escape(id)}"]`);
  }

  /** Put `row` in place of the row with its id, or at the end (at the start with `first`). */
  put(row, { first = null } = {}) {
    const existing = this.find(row.dataset.id);
    if (existing) existing.replaceWith(row);
    else if (first) this.container.insertBefore(row, first);
    else this.container.append(row);
    return row;
  }

  // -- the display read ----------------------------------------------------------------------------

  /** Draw a display page's rows (oldest first); `older` puts them above the rows already shown. */
  showRows(rows, { older = false } = {}) {
    const first = older ? this.container.firstElementChild : null;
    for (const row of rows) {
      const node = this.displayRow(row);
      if (node) this.put(node, { first });
    }
  }

  displayRow(row) {
    switch (row.kind) {
      case "user":
        return this.userRow(row.id, row.text, row.image_count);
      case "assistant":
        return this.assistantRow(row);
      case "tool":
        return this.toolRow(row.id, {
          name: row.tool_name,
          assistantId: row.assistant_id,
          input: row.arguments,
          state: row.result == null ? "running" : row.result.is_error ? "failed" : "done",
          output: row.result?.text,
        });
      case "event":
        return this.eventRow(row.id, row.details);
      case "delegation":
        return this.delegationRow(row.id, row.finish);
      case "message":
        return this.senderRow(row);
      case "blocks":
        return this.blocksRow(row);
      default:
        console.error("a display row this page does not know", row.kind);
        return null;
    }
  }

  userRow(id, text, imageCount = 0, { pending = false } = {}) {
    const row = element("div", `row user${pending ? " pending" : ""}`);
    row.dataset.id = id;
    row.append(element("p", "text", text));
    if (imageCount > 0) row.append(element("p", "images", `${imageCount} image${imageCount === 1 ? "" : "s"} attached`));
    return row;
  }

  assistantRow(reply) {
    const row = element("div", "row assistant");
    row.dataset.id = reply.id;
    row.dataset.model = reply.model;
    if (reply.thinking) row.append(this.thinking(reply.thinking));
    if (reply.text) row.append(element("p", "text", reply.text));
    if (reply.error_message) row.append(element("p", "error", reply.error_message));
    if (reply.blocks) row.append(this.cards(reply.blocks.blocks));
    return row;
  }

  thinking(text) {
    const details = element("details", "thinking");
    details.append(element("summary", null, "Thinking"), element("p", "text", text));
    return details;
  }

  toolRow(id, tool) {
    this.tools.set(id, { ...this.tools.get(id), ...tool });
    const model = this.tools.get(id);
    const row = element("div", "row tool");
    row.dataset.id = id;
    row.dataset.state = model.state;
    if (model.assistantId) row.dataset.assistantId = model.assistantId;
    row.append(element("span", "name", model.name), element("span", "status", TOOL_STATUS[model.state]));
    if (model.input != null || model.inputText) row.append(element("pre", "input", model.input != null ?
      shown(model.input) : model.inputText));
    if (model.output != null) row.append(element("pre", "output", shown(model.output)));
    if (model.state === "approval") {
      const buttons = element("div", "approval");
      const answer = (approved) => {
        for (const button of buttons.querySelectorAll("button")) button.disabled = true;
        this.onApproval({ toolCallId: id, approvalId: model.approvalId, approved });
      };
      const approve = element("button", "approve", "Approve");
      const deny = element("button", "deny", "Deny");
      approve.type = deny.type = "button";
      approve.addEventListener("click", () => answer(true));
      deny.addEventListener("click", () => answer(false));
      buttons.append(approve, deny);
      row.append(buttons);
    }
    return row;
  }

  /** A row drawn from the stream: marked live, dropped when the display is read again. */
  putLive(row) {
    row.dataset.live = "";
    return this.put(row);
  }

  updateTool(id, change) {
    return this.putLive(this.toolRow(id, change));
  }

  /** A call's approval was answered (in this tab or another): it runs, or is refused. */
  approvalAnswered(id, allowed) {
    if (this.tools.get(id)?.state === "approval") this.updateTool(id, { state: allowed ? "running" : "denied" });
  }

  /** The person's message as sent, shown until the journal's row for it is read. */
  pendingUser(text) {
    this.pendingCount += 1;
    return this.putLive(this.userRow(`pending-${this.pendingCount}`, text, 0, { pending: true }));
  }

  /** Remove every row drawn from a stream: a display read is about to draw the journal's. */
  dropLive() {
    for (const row of this.container.querySelectorAll("[data-live]")) {
      this.tools.delete(row.dataset.id);
      row.remove();
    }
    this.live = null;
  }

  eventRow(id, details) {
    const words = chatEventWords(details);
    if (words == null) return null;
    const row = element("div", "row event", words.text);
    row.dataset.id = id;
    row.dataset.tone = words.tone;
    row.dataset.kind = details.kind;
    return row;
  }

  /** Where a delegated job's result reached the conversation, worded from its finish marker. */
  delegationRow(id, finish) {
    const words = delegationWords(finish);
    const row = element("div", "row event delegation", words.text);
    row.dataset.id = id;
    row.dataset.tone = words.tone;
    return row;
  }

  senderRow(message) {
    const row = element("div", "row sender");
    row.dataset.id = message.id;
    row.append(element("span", "from", message.sender === "garden" ? "from the garden" : `from ${message.sender}`),
      element("p", "text", message.text));
    return row;
  }

  /** A reply's blocks go under the reply when it is shown, else they are a row of their own. */
  blocksRow(blocks) {
    const reply = blocks.assistant_id ? this.find(blocks.assistant_id) : null;
    if (reply) {
      reply.querySelector(":scope > .blocks")?.remove();
      reply.append(this.cards(blocks.blocks));
      return null;
    }
    const row = element("div", "row");
    row.dataset.id = blocks.id;
    row.append(this.cards(blocks.blocks));
    return row;
  }

  cards(blocks) {
    const list = element("div", "blocks");
    for (const block of blocks) {
      const card = element("article", "card");
      if (block.image) {
        const image = element("img");
        image.alt = block.title;
        this.loadImage(block.image.ref).then((url) => { image.src = url; }, (error) => console.error(error));
        card.append(image);
      }
      const title = element("h3");
      if (block.link) {
        const link = element("a", null, block.title);
        link.href = block.link;
        link.rel = "noopener noreferrer";
        link.target = "_blank";
        title.append(link);
      } else {
        title.textContent = block.title;
      }
      card.append(title, element("p", null, block.text));
      list.append(card);
    }
    return list;
  }

  // -- the streaming turn (AI SDK UI message stream parts) -----------------------------------------

  /** The row the current step's reasoning and text go in, made when the step first writes. */
  step() {
    const live = this.live;
    if (live.step == null) {
      live.step = element("div", "row assistant");
      live.step.dataset.id = `live-${live.messageId}-${live.steps++}`;
      live.step.dataset.state = "streaming";
      this.putLive(live.step);
    }
    return live.step;
  }

  /** Apply one part of the stream; returns true when it ended the message. */
  apply(part) {
    if (part.type === "start" || this.live == null) {
      this.live = { messageId: part.messageId ?? "message", steps: 0, step: null, parts: new Map() };
      if (part.type === "start") return false;
    }
    const live = this.live;
    switch (part.type) {
      case "start-step":
      case "finish-step":
        this.endStep();
        return false;
      case "reasoning-start": {
        const details = this.thinking("");
        this.step().append(details);
        live.parts.set(part.id, details.querySelector(".text"));
        return false;
      }
      case "text-start": {
        const text = element("p", "text", "");
        this.step().append(text);
        live.parts.set(part.id, text);
        return false;
      }
      case "reasoning-delta":
      case "text-delta":
        live.parts.get(part.id)?.append(part.delta);
        return false;
      case "reasoning-end":
      case "text-end":
        live.parts.get(part.id)?.normalize();
        return false;
      case "tool-input-start":
        this.toolStarts(part.toolCallId, part.toolName);
        return false;
      case "tool-input-delta": {
        const tool = this.tools.get(part.toolCallId);
        if (tool) this.updateTool(part.toolCallId, { inputText: (tool.inputText ?? "") + part.inputTextDelta });
        return false;
      }
      case "tool-input-available":
        if (!this.tools.has(part.toolCallId)) this.toolStarts(part.toolCallId, part.toolName);
        this.updateTool(part.toolCallId, { input: part.input, state: "running" });
        return false;
      case "tool-input-error":
        this.updateTool(part.toolCallId, { input: part.input, state: "failed", output: part.errorText });
        return false;
      case "tool-approval-request":
        this.updateTool(part.toolCallId, { state: "approval", approvalId: part.approvalId });
        return false;
      case "tool-output-available":
        this.updateTool(part.toolCallId, { state: part.preliminary ? "running" : "done", output: part.output });
        return false;
      case "tool-output-error": {
        const denied = this.tools.get(part.toolCallId)?.state === "denied"; // its refusal, as the model reads it
        this.updateTool(part.toolCallId, { state: denied ? "denied" : "failed", output: part.errorText });
        return false;
      }
      case "tool-output-denied":
        this.updateTool(part.toolCallId, { state: "denied" });
        return false;
      case "data-chat-event": {
        const row = this.eventRow(part.id, part.data.details);
        if (row) this.putLive(row);
        this.endStep();
        return false;
      }
      case "data-message-blocks": {
        const row = this.blocksRow(part.data);
        if (row) this.putLive(row);
        return false;
      }
      case "steering-message": {
        const text = part.parts.filter((p) => p.type === "text").map((p) => p.text).join("\n\n");
        const pending = [...this.container.querySelectorAll(".user.pending")].find(
          (row) => row.textContent === text);
        pending?.remove();
        this.endStep();
        this.putLive(this.userRow(part.id, text));
        return false;
      }
      case "reset-step":
        // A failed attempt of the step: its retry draws the step again.
        live.step?.remove();
        live.step = null;
        live.steps = Math.max(0, live.steps - 1);
        return false;
      case "error": {
        const row = element("div", "row event", `✗ ${part.errorText}`);
        row.dataset.id = `live-${live.messageId}-error`;
        row.dataset.tone = "bad";
        this.putLive(row);
        return false;
      }
      case "abort":
      case "finish":
        this.endStep();
        this.live = null;
        return true;
      default:
        return false; // a part this page draws nothing for (metadata, sources)
    }
  }

  /**
   * A tool call starts. When the display read shows it already, the stream is replaying a step
   * that is durable: the read's copies of the call and of the reply that made it go, since the
   * replay draws them again, in their place in the turn.
   */
  toolStarts(id, name) {
    const durable = this.find(id);
    if (durable && !("live" in durable.dataset)) {
      if (durable.dataset.assistantId) this.find(durable.dataset.assistantId)?.remove();
      durable.remove();
      this.tools.delete(id);
    }
    this.endStep();
    this.updateTool(id, { name, state: "input" });
  }

  endStep() {
    if (this.live?.step) {
      delete this.live.step.dataset.state;
      this.live.step = null;
    }
  }
}
