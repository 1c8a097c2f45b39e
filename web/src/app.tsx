// The page: the conversation list (named, dated, searchable, renamed and deleted in place) and
// the user's gardens below it, the open conversation (its address is `?c=ID`) or garden (`?g=NAME`),
// and the sign-in dialog a server with tokens asks for. Below 48rem the list is a drawer the menu
// button opens.

import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { api, type CommandInfo, type ConversationInfo, type GardenInfo, type ModelInfo, onSignIn, type Project }
  from "./api";
import { ConversationView, type Shared } from "./conversation";
import { GardenView } from "./garden";

function addressed(): string | null {
  return new URLSearchParams(location.search).get("c");
}

function addressedGarden(): string | null {
  return new URLSearchParams(location.search).get("g");
}

const day = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric" });
const time = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });

/** When a conversation was last written: the time today, else the day. */
function when(ms: number): string {
  const date = new Date(ms);
  return date.toDateString() === new Date().toDateString() ? time.format(date) : day.format(date);
}

function SignIn({ asked }: { asked: ((token: string) => void) | null }) {
  const dialog = useRef<HTMLDialogElement>(null);
  const field = useRef<HTMLInputElement>(null);
  useEffect(() => {
    if (asked && !dialog.current?.open) {
      if (field.current) field.current.value = "";
      dialog.current?.showModal();
    }
  }, [asked]);
  return (
    <dialog id="sign-in" ref={dialog} onClose={() => asked?.(field.current?.value ?? "")}>
      <form method="dialog">
        <p>This server asks for a token (<code>harness token create USER</code>).</p>
        <input id="token" ref={field} type="password" autoComplete="off" aria-label="Token" />
        <button type="submit">Sign in</button>
      </form>
    </dialog>
  );
}

export function App() {
  const [conversations, setConversations] = useState<ConversationInfo[]>([]);
  const [current, setCurrent] = useState<string | null>(addressed);
  const [garden, setGarden] = useState<string | null>(addressedGarden);
  const [gardens, setGardens] = useState<GardenInfo[]>([]);
  const [search, setSearch] = useState("");
  const [drawer, setDrawer] = useState(false);
  const [renaming, setRenaming] = useState<string | null>(null);
  const [asked, setAsked] = useState<((token: string) => void) | null>(null);
  const [models, setModels] = useState<ModelInfo[]>([]);
  const [projects, setProjects] = useState<Project[]>([]);
  const [commands, setCommands] = useState<CommandInfo[]>([]);
  const [problem, setProblem] = useState<string | null>(null);

  useEffect(() => {
    // One dialog however many requests are refused: they all wait for the same token.
    let waiting: Promise<string> | null = null;
    onSignIn(() => {
      waiting ??= new Promise<string>((resolve) => setAsked(() => (token: string) => {
        waiting = null;
        setAsked(null);
        resolve(token);
      }));
      return waiting;
    });
  }, []);

  const list = useCallback(async () => {
    setConversations(await api.conversations());
  }, []);

  useEffect(() => {
    list().catch((error) => setProblem(String(error.message ?? error)));
    api.models().then(setModels, () => setModels([]));
    api.projects().then(setProjects, () => setProjects([]));
    api.commands().then(setCommands, () => setCommands([]));
    api.gardens().then(setGardens, () => setGardens([]));
    const back = () => {
      setCurrent(addressed());
      setGarden(addressedGarden());
    };
    window.addEventListener("popstate", back);
    return () => window.removeEventListener("popstate", back);
  }, [list]);

  function open(id: string | null) {
    history.pushState(null, "", id ? `?c=${encodeURIComponent(id)}` : "/");
    setCurrent(id);
    setGarden(null);
    setDrawer(false);
  }

  function openGarden(name: string) {
    history.pushState(null, "", `?g=${encodeURIComponent(name)}`);
    setGarden(name);
    setCurrent(null);
    setDrawer(false);
  }

  async function create() {
    const made = await api.create();
    await list();
    open(made.id);
  }

  async function rename(id: string, name: string) {
    setRenaming(null);
    await api.rename(id, name.trim() || null);
    await list();
  }

  async function remove(conversation: ConversationInfo) {
    if (!confirm(`Delete “${conversation.name ?? "New conversation"}” and everything in it?`)) return;
    await api.remove(conversation.id);
    if (current === conversation.id) open(null);
    await list();
  }

  const shared: Shared = useMemo(() => ({ models, projects, commands, changed: () => { list().catch(() => {}); } }),
    [models, projects, commands, list]);
  const known = current != null && conversations.some((conversation) => conversation.id === current);
  const found = conversations.filter((conversation) =>
    (conversation.name ?? "New conversation").toLowerCase().includes(search.trim().toLowerCase()));
  const fail = (error: Error) => setProblem(error.message);
  const menu = (
    <button id="menu" type="button" aria-label="Conversations" aria-expanded={drawer}
      onClick={() => setDrawer(!drawer)}>☰</button>
  );

  return (
    <div id="page" data-drawer={drawer ? "open" : "closed"}>
      <aside id="sidebar">
        <button id="new-conversation" type="button" onClick={() => create().catch(fail)}>+ New conversation</button>
        <input id="search" type="search" placeholder="Search" aria-label="Search conversations" value={search}
          onChange={(event) => setSearch(event.target.value)} />
        <ul id="conversations" aria-label="Conversations">
          {found.map((conversation) => (
            <li key={conversation.id}>
              {renaming === conversation.id ? (
                <input className="rename" aria-label="Name" defaultValue={conversation.name ?? ""} autoFocus
                  onKeyDown={(event) => {
                    if (event.key === "Enter") rename(conversation.id, event.currentTarget.value).catch(fail);
                    if (event.key === "Escape") setRenaming(null);
                  }}
                  onBlur={(event) => rename(conversation.id, event.currentTarget.value).catch(fail)} />
              ) : (
                <a href={`?c=${encodeURIComponent(conversation.id)}`} data-id={conversation.id}
                  aria-current={conversation.id === current ? "page" : undefined}
                  onClick={(event) => { event.preventDefault(); open(conversation.id); }}>
                  <span className="name">{conversation.name ?? "New conversation"}</span>
                  <time dateTime={new Date(conversation.updated_at).toISOString()}>{when(conversation.updated_at)}</time>
                </a>
              )}
              <span className="tools">
                <button type="button" className="rename-button" aria-label="Rename" title="Rename"
                  onClick={() => setRenaming(conversation.id)}>✎</button>
                <button type="button" className="delete-button" aria-label="Delete" title="Delete"
                  onClick={() => remove(conversation).catch(fail)}>🗑</button>
              </span>
            </li>
          ))}
        </ul>
        {gardens.length > 0 && (
          <nav id="gardens" aria-label="Gardens">
            <h2>Gardens</h2>
            <ul>
              {gardens.map((item) => (
                <li key={item.name}>
                  <a href={`?g=${encodeURIComponent(item.name)}`} data-name={item.name}
                    aria-current={item.name === garden ? "page" : undefined}
                    onClick={(event) => { event.preventDefault(); openGarden(item.name); }}>
                    <span className="name">{item.name}</span>
                    <span className="count" title="active goals">{item.active_goals}</span>
                  </a>
                </li>
              ))}
            </ul>
          </nav>
        )}
        {problem && <p className="problem" role="alert">{problem}</p>}
      </aside>
      <div id="scrim" onClick={() => setDrawer(false)} />
      {garden != null && !known ? (
        <GardenView key={garden} name={garden} menu={menu} />
      ) : known ? (
        <ConversationView key={current} id={current} shared={shared} menu={menu}
          name={conversations.find((conversation) => conversation.id === current)?.name ?? null} />
      ) : (
        <main id="welcome">
          <header>{menu}</header>
          <div className="empty">
            <h1>Harness</h1>
            <p>Durable conversations with your agent: a reload, a second tab or a restart never loses a turn.</p>
            <button id="start" type="button" onClick={() => create().catch(fail)}>Start a conversation</button>
          </div>
        </main>
      )}
      <SignIn asked={asked} />
    </div>
  );
}
