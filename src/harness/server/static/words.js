// How the page words a chat-event row: from its typed details only, never from the English text
// the model reads (CE-5). Outside text in the details (an error's public text, a name, a command)
// is returned as text and set with textContent by the caller, never parsed as HTML.

const STOPPED = {
  user: "interrupted by you",
  user_during_tool: "interrupted by you during a tool call",
  step_ceiling: "stopped: the turn reached its limit of steps",
  parent: "stopped by the agent that delegated it",
  deleted: "stopped: the conversation was deleted",
  probe: "stopped by an internal probe",
};

const MODES = { build: "build (every tool)", plan: "plan (read-only tools)" };

/** How a `/goal pause|resume|drop` row words the status it set. */
const GOAL_ACTED = { paused: "paused", active: "resumed", dropped: "dropped" };

export function modelName(model) {
  return `${model.provider}/${model.model_id}`;
}

/** What a model switch did to the tools that follow the model (null: nothing). */
function toolsFollowed(tools) {
  if (tools == null) return "";
  return tools.length ? ` · tools: ${tools.join(", ")}` : " · no tools";
}

function errorText(details) {
  const notice = details.notice;
  if (notice == null) return details.text; // the provider's or an exception's own text, verbatim
  switch (notice.code) {
    case "context-overflow":
      return "the conversation no longer fits the model's context window, even compacted";
    case "compaction-stopped":
      return `compaction stopped after ${notice.failures} failures in a row (the last: ${notice.last_error}); ` +
        "the turn goes on without compacting";
    case "model-switch-failed":
      return `could not switch the model to ${modelName(notice.requested)}`;
    default:
      return details.text;
  }
}

function outcomeText(outcome) {
  if (outcome == null) return "";
  switch (outcome.command) {
    case "compact":
      return { compacted: "compacted", nothing_old_enough: "nothing old enough to compact", aborted: "stopped" }[
        outcome.result] ?? "the compaction failed";
    case "fast":
      return `fast mode ${outcome.on ? "on" : "off"}: ${modelName(outcome.model)}, reasoning ${outcome.thinking_level}`;
    case "model":
      return `model ${modelName(outcome.model)}${toolsFollowed(outcome.tools)}`;
    case "rename":
      return outcome.name ? `named ${outcome.name}` : "name cleared";
    case "mode":
      return `mode ${MODES[outcome.mode]}`;
    case "tools":
      return `tools: ${outcome.tools.join(", ") || "none"} (${outcome.chosen ? "chosen, kept across model switches" :
        "the model's"})`;
    case "restart":
      return "restarted from its journal";
    case "goal":
      return `the garden ${outcome.garden} pursues the goal ${outcome.title}`;
    case "goal_action":
      return `goal ${outcome.title} ${GOAL_ACTED[outcome.status] ?? outcome.status}`;
    case "context":
      return outcome.files.length
        ? `project instructions: ${outcome.files.map((file) => file.path).join(", ")}`
        : "no AGENTS.md or CLAUDE.md applies here";
    default:
      return "";
  }
}

/**
 * The row for a chat event's `details`: `{text, tone}` with tone "warn", "bad" or "quiet"; null for
 * a shape this page does not know, which renders nothing and is logged (CE-5).
 */
export function chatEventWords(details) {
  switch (details?.kind) {
    case "interrupted":
      return { text: `■ ${STOPPED[details.cause] ?? "stopped"}`, tone: "warn" };
    case "error":
      return { text: `✗ ${errorText(details)}`, tone: "bad" };
    case "model":
      return { text: `model: ${details.previous ? `${modelName(details.previous)} → ` : ""}${modelName(details.model)}` +
        toolsFollowed(details.tools), tone: "quiet" };
    case "rename":
      return { text: details.name ? `renamed: ${details.name}` : "name cleared", tone: "quiet" };
    case "cwd": {
      const where = details.project ? `project ${details.project} (${details.path})` : details.path;
      return { text: details.by === "agent" ? `the agent switched to ${where}` : `now working in ${where}`,
        tone: "quiet" };
    }
    case "mode":
      return { text: `mode: ${MODES[details.mode]}`, tone: "quiet" };
    case "reasoning":
      return { text: `reasoning: ${details.previous} → ${details.level}`, tone: "quiet" };
    case "command": {
      const invocation = `/${details.name}${details.args ? ` ${details.args}` : ""}`;
      if (details.error != null) return { text: `${invocation}: failed: ${details.error}`, tone: "bad" };
      const said = outcomeText(details.outcome) || details.output || "";
      return { text: said ? `${invocation}: ${said}` : invocation, tone: "quiet" };
    }
    case "shell": {
      const status = details.exit_code == null ? "could not finish" : `exit ${details.exit_code}`;
      const output = details.output ? `\n${details.truncated ? "…" : ""}${details.output}` : "";
      return { text: `! ${details.command} · ${status}${output}`, tone: details.exit_code === 0 ? "quiet" : "warn" };
    }
    case "compacted": {
      const before = details.tokens_before != null ? `, ${details.tokens_before} tokens before` : "";
      return { text: `compacted (${details.reason}${before})`, tone: "quiet" };
    }
    case "goal":
      return { text: `goal ${details.title}: ${details.status}`, tone: "quiet" };
    case "allowed":
      return { text: `${details.rule} runs without asking for the rest of this conversation`, tone: "quiet" };
    default:
      console.error("a chat event with details this page does not know", details);
      return null;
  }
}

const FINISHED = { completed: ["finished", "quiet"], failed: ["failed", "bad"], aborted: ["was stopped", "warn"] };

/** The row of a delegated job's finish marker (CE-18): `{text, tone}`. */
export function delegationWords(finish) {
  const [ended, tone] = FINISHED[finish.outcome];
  if (finish.kind === "workflow") {
    const { completed, failed, aborted } = finish.tally;
    return { text: `⇢ workflow ${finish.title} ${ended} · ${completed} completed, ${failed} failed, ${aborted} stopped`,
      tone };
  }
  return { text: `⇢ agent ${finish.agent} ${ended}: ${finish.task}`, tone };
}
