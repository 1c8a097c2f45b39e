// A garden's view (`?g=NAME`): its goals, with the actions a goal takes, and its inbox, the
// replies it gave in conversations apart from the notes it wrote to nobody in particular (OM-5),
// newest first, each as Markdown.

import { useCallback, useEffect, useState } from "react";
import { api, type GoalAction, type Goal, type Inbox, type InboxFile } from "./api";
import { Markdown } from "./markdown";

const when = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });

/** The actions a goal of `status` offers. */
const ACTIONS: Record<Goal["status"], GoalAction[]> = {
  active: ["pause", "drop", "conclude"], paused: ["resume", "drop"], dropped: ["resume"], done: [],
};

function Messages({ id, title, files, none }: { id: string; title: string; files: InboxFile[]; none: string }) {
  return (
    <section id={id} className="inbox" aria-label={title}>
      <h2>{title}</h2>
      {files.length === 0 && <p className="none">{none}</p>}
      {files.map((file) => (
        <article key={file.name} className="inbox-file" data-name={file.name}>
          <Markdown text={file.text} />
          {file.truncated && <p className="none">Cut at its first {file.text.length.toLocaleString()} characters
            of {file.size.toLocaleString()} bytes (<code>harness garden inbox</code> shows it whole).</p>}
        </article>
      ))}
    </section>
  );
}

export function GardenView({ name, menu }: { name: string; menu: React.ReactNode }) {
  const [goals, setGoals] = useState<Goal[] | null>(null);
  const [inbox, setInbox] = useState<Inbox | null>(null);
  const [problem, setProblem] = useState<string | null>(null);
  const fail = useCallback((error: Error) => setProblem(error.message), []);

  const read = useCallback(async () => {
    const [listed, messages] = await Promise.all([api.goals(name), api.inbox(name)]);
    setGoals(listed);
    setInbox(messages);
  }, [name]);

  useEffect(() => {
    read().catch(fail);
  }, [read, fail]);

  async function act(goal: Goal, action: GoalAction) {
    setProblem(null);
    await api.goalAction(name, goal.id, action);
    await read();
  }

  return (
    <main id="garden">
      <header>
        {menu}
        <h1 id="title" title={name}>{name}</h1>
        <button type="button" onClick={() => read().catch(fail)}>Refresh</button>
      </header>
      <div className="garden-body">
        {problem && <p id="error" role="alert">{problem}</p>}
        <section id="goals" aria-label="Goals">
          <h2>Goals</h2>
          {goals?.length === 0 && <p className="none">No goals yet: give one with <code>/goal</code> in a
            conversation.</p>}
          <ul>
            {goals?.map((goal) => (
              <li key={goal.id} data-id={goal.id} data-status={goal.status}>
                <span className="goal-text">{goal.text}</span>
                <span className="goal-meta">{goal.type} · {goal.status}
                  {goal.last_run_at != null && ` · last run ${when.format(new Date(goal.last_run_at))}`}</span>
                <span className="goal-actions">
                  {ACTIONS[goal.status].map((action) => (
                    <button key={action} type="button" data-action={action}
                      onClick={() => act(goal, action).catch(fail)}>{action}</button>
                  ))}
                </span>
              </li>
            ))}
          </ul>
        </section>
        {inbox && (
          <div className="inboxes">
            <Messages id="replies" title="Replies" files={inbox.replies}
              none="No replies: what the garden says in a conversation is copied here." />
            <Messages id="notes" title="Notes" files={inbox.notes}
              none="No notes: what the garden writes at a tending, to nobody in particular, lands here." />
          </div>
        )}
        {inbox?.more && <p className="none">Older messages: <code>harness garden inbox {name}</code>.</p>}
      </div>
    </main>
  );
}
