import { type ChatEventDetails, type DelegationFinish, type ModelIdentity, modelName } from "./api";

// How the page words a chat-event row: from its typed details only, never from the English text
// the model reads (CE-5). Outside text in the details (an error's public text, a name, a command)
// is returned as text and set with textContent by the caller, never parsed as HTML.

const STOPPED: Record<string, string> = {
  user: "interrupted by you",
  user_during_tool: "interrupted by you during a tool call",
  step_ceiling: "stopped: the turn reached its limit of steps",
  parent: "stopped by the agent that delegated it",
  deleted: "stopped: the conversation was deleted",
  probe: "stopped by an internal probe",
};

const MODES: Record<string, string> = { build: "build (all of this session's tools)", plan: "plan (read-only tools)" };

/** How a `/goal pause|resume|drop` row words the status it set. */
type Any = any;

export type Tone = "warn" | "bad" | "quiet";

/** A row's words and tone. */
export interface Words {
  text: string;
  tone: Tone;
}

const GOAL_ACTED: Record<string, string> = { paused: "paused", active: "resumed", dropped: "dropped" };

/** What a model switch did to the tools that follow the model (null: nothing). */
function toolsFollowed(tools: unknown): string {
  if (!Array.isArray(tools)) return "";
  return tools.length ? ` · tools: ${tools.join(", ")}` : " · no tools";
}

/** An amount of a budget row's unit, as the terminal says it: `1,234 tokens`, `$0.0012`. */
function amount(unit: string, value: number): string {
  return unit === "tokens"
    ? `${Math.round(value).toLocaleString("en-US")} tokens`
    : `$${value.toLocaleString("en-US", { minimumFractionDigits: 4, maximumFractionDigits: 4 })}`;
}

function errorText(details: Any): string {
  const notice = details.notice;
  if (notice == null) return details.text; // the provider's or an exception's own text, verbatim
  switch (notice.code) {
    case "context-overflow":
      return "the conversation no longer fits the model's context window, even compacted";
    case "compaction-stopped":
      return `compaction stopped after ${notice.failures} failures in a row (the last: ${notice.last_error}); ` +
        "the turn goes on without compacting";
    case "model-switch-failed":
      return `could not switch the model to ${modelName(notice.requested as ModelIdentity)}`;
    default:
      return details.text;
  }
}

function outcomeText(outcome: Any): string {
  if (outcome == null) return "";
  switch (outcome.command) {
    case "compact":
      return ({ compacted: "compacted", nothing_old_enough: "nothing old enough to compact", aborted: "stopped" } as Record<string, string>)[
        outcome.result] ?? "the compaction failed";
    case "fast":
      return `fast mode ${outcome.on ? "on" : "off"}: ${modelName(outcome.model)}, reasoning ${outcome.thinking_level}`;
    case "model":
      return outcome.queued ? `model ${modelName(outcome.model)} after the running turn` :
        `model ${modelName(outcome.model)}${toolsFollowed(outcome.tools)}`;
    case "rename":
      return outcome.name ? `named ${outcome.name}` : "name cleared";
    case "mode":
      return `mode ${MODES[outcome.mode]}`;
    case "tools": {
      const others = (outcome.available as string[]).filter((name) => !outcome.tools.includes(name));
      return `tools: ${outcome.tools.join(", ") || "none"} (${outcome.chosen ?
        "your choice, kept across model switches" : "the model's"})` +
        (others.length ? `; /tools +NAME adds one of ${others.join(", ")}` : "");
    }
    case "restart":
      return "restarted from the journal";
    case "goal":
      return `goal ${outcome.title} given to garden ${outcome.garden}`;
    case "goal_action":
      return `goal ${outcome.title} ${GOAL_ACTED[outcome.status] ?? outcome.status}`;
    case "context":
      return contextText(outcome);
    default:
      return "";
  }
}

/** `/context`'s files, one a line: path, size (and how much of it is read), a short sha256. */
function contextText(outcome: Any): string {
  if (!outcome.files.length) return "no AGENTS.md or CLAUDE.md applies here";
  const count = (n: number) => n.toLocaleString("en-US");
  return [`project instructions, at most ${count(outcome.limit_bytes)} bytes` +
    (outcome.current ? "" : " (changed since the last turn: the next one reads these)"),
  ...outcome.files.map((file: Any) => `  ${file.path} · ${count(file.size)} bytes` +
    (file.included === file.size ? "" : `, the first ${count(file.included)} read`) + ` · sha256 ${
      file.sha256.slice(0, 12)}`)].join("\n");
}

/**
 * The row for a chat event's `details`: `{text, tone}` with tone "warn", "bad" or "quiet"; null for
 * a shape this page does not know, which renders nothing and is logged (CE-5).
 */
export function chatEventWords(details: ChatEventDetails | null | undefined): Words | null {
  const d = details as Any;
  switch (d?.kind) {
    case "interrupted":
      return { text: `■ ${STOPPED[d.cause] ?? "stopped"}`, tone: "warn" };
    case "error":
      return { text: `✗ ${errorText(d)}`, tone: "bad" };
    case "model":
      return { text: `model: ${d.previous ? `${modelName(d.previous)} → ` : ""}${modelName(d.model)}` +
        toolsFollowed(d.tools) + (d.by === "fallback" ? ` (fallback: ${d.reason ?? "it kept failing"})` : ""),
        tone: "quiet" };
    case "budget":
      return { text: `■ stopped: the ${d.scope} reached its budget of ${amount(d.unit, d.limit)} ` +
        `(${amount(d.unit, d.spent)} used)`, tone: "warn" };
    case "rename":
      return { text: d.name ? `renamed: ${d.name}` : "name cleared", tone: "quiet" };
    case "cwd": {
      // As the terminal words them: who moved, and where to.
      const where = d.project ? `${d.project} (${d.path})` : d.path;
      const text = d.by === "agent" ? (d.project ? `the agent switched to project ${where}` :
        `the agent moved to ${where}`) : (d.project ? `project: ${where}` : `working directory: ${where}`);
      return { text, tone: "quiet" };
    }
    case "mode":
      return { text: `mode: ${MODES[d.mode]}`, tone: "quiet" };
    case "reasoning":
      return { text: `reasoning: ${d.previous} → ${d.level}`, tone: "quiet" };
    case "command": {
      const invocation = `/${d.name}${d.args ? ` ${d.args}` : ""}`;
      if (d.error != null) return { text: `${invocation}: failed: ${d.error}`, tone: "bad" };
      const said = outcomeText(d.outcome) || d.output || "";
      return { text: said ? `${invocation}: ${said}` : invocation, tone: "quiet" };
    }
    case "shell": {
      const status = d.exit_code == null ? "could not finish" : `exit ${d.exit_code}`;
      const output = d.output ? `\n${d.truncated ? "…" : ""}${d.output}` : "";
      return { text: `! ${d.command} · ${status}${output}`, tone: d.exit_code === 0 ? "quiet" : "warn" };
    }
    case "compacted": {
      const before = d.tokens_before != null ? `, ${d.tokens_before} tokens before` : "";
      return { text: `compacted (${d.reason}${before})`, tone: "quiet" };
    }
    case "goal":
      return { text: `goal ${d.title}: ${d.status}`, tone: "quiet" };
    case "allowed":
      return { text: `${d.rule} runs without asking for the rest of this conversation`, tone: "quiet" };
    default:
      console.error("a chat event with details this page does not know", details);
      return null;
  }
}

const FINISHED: Record<string, [string, Tone]> = { completed: ["finished", "quiet"], failed: ["failed", "bad"], aborted: ["was stopped", "warn"] };

/** The row of a delegated job's finish marker (CE-18): `{text, tone}`. */
export function delegationWords(finish: DelegationFinish): Words {
  const [ended, tone] = FINISHED[finish.outcome];
  if (finish.kind === "workflow") {
    const { completed, failed, aborted } = finish.tally ?? { completed: 0, failed: 0, aborted: 0 };
    return { text: `⇢ workflow ${finish.title} ${ended} · ${completed} completed, ${failed} failed, ${aborted} stopped`,
      tone };
  }
  return { text: `⇢ agent ${finish.agent} ${ended}: ${finish.task}`, tone };
}
