// Replies as Markdown: Streamdown (GitHub-flavoured Markdown, half-written syntax mended while a
// reply streams, raw HTML sanitized by rehype-sanitize and links and images hardened by its default
// rehype plugins), with code highlighted by Shiki. The highlighter holds a fixed set of languages
// built in, so the page ships a few hundred kilobytes of grammars and not all of Shiki's; a fence
// in another language is shown plain.
import { createHighlighterCoreSync } from "shiki/core";
import { createJavaScriptRegexEngine } from "shiki/engine/javascript";
import bash from "shiki/langs/bash.mjs";
import css from "shiki/langs/css.mjs";
import diff from "shiki/langs/diff.mjs";
import go from "shiki/langs/go.mjs";
import html from "shiki/langs/html.mjs";
import javascript from "shiki/langs/javascript.mjs";
import json from "shiki/langs/json.mjs";
import markdown from "shiki/langs/markdown.mjs";
import python from "shiki/langs/python.mjs";
import rust from "shiki/langs/rust.mjs";
import sql from "shiki/langs/sql.mjs";
import toml from "shiki/langs/toml.mjs";
import tsx from "shiki/langs/tsx.mjs";
import typescript from "shiki/langs/typescript.mjs";
import yaml from "shiki/langs/yaml.mjs";
import githubDark from "shiki/themes/github-dark.mjs";
import githubLight from "shiki/themes/github-light.mjs";
import { type BundledLanguage, type CodeHighlighterPlugin, Streamdown, type ThemeInput } from "streamdown";

const highlighter = createHighlighterCoreSync({
  themes: [githubLight, githubDark],
  langs: [bash, css, diff, go, html, javascript, json, markdown, python, rust, sql, toml, tsx, typescript, yaml],
  engine: createJavaScriptRegexEngine({ forgiving: true }),
});

/** A fence's language as the highlighter knows it (`py` is python), or null. */
function known(language: string): string | null {
  const name = language.trim().toLowerCase();
  const loaded = highlighter.getLoadedLanguages();
  if (loaded.includes(name)) return name;
  const aliases: Record<string, string> = { py: "python", sh: "bash", shell: "bash", zsh: "bash", console: "bash",
    js: "javascript", ts: "typescript", jsx: "tsx", yml: "yaml", md: "markdown", rs: "rust", patch: "diff" };
  return aliases[name] ?? null;
}

function themeName(theme: ThemeInput): string {
  return typeof theme === "string" ? theme : (theme.name ?? "github-light");
}

const code: CodeHighlighterPlugin = {
  name: "shiki",
  type: "code-highlighter",
  supportsLanguage: (language) => known(language) != null,
  getSupportedLanguages: () => highlighter.getLoadedLanguages() as BundledLanguage[],
  getThemes: () => ["github-light", "github-dark"],
  highlight: ({ code: text, language, themes }) =>
    highlighter.codeToTokens(text, {
      lang: known(language) ?? "text",
      themes: { light: themeName(themes[0]), dark: themeName(themes[1]) },
    }),
};

// Emphasis as the elements that say it (Streamdown draws styled spans), for readers and tests alike.
const components = {
  strong: ({ children }: { children?: React.ReactNode }) => <strong>{children}</strong>,
  em: ({ children }: { children?: React.ReactNode }) => <em>{children}</em>,
};

/** `text` rendered as Markdown; `streaming` while the reply is still being written. */
export function Markdown({ text, streaming = false }: { text: string; streaming?: boolean }) {
  return (
    <Streamdown className="markdown" plugins={{ code }} isAnimating={streaming} mode={streaming ? "streaming" : "static"}
      controls={{ code: true, table: false, mermaid: false }} linkSafety={{ enabled: false }} components={components}>
      {text}
    </Streamdown>
  );
}

/** The language a file's name suggests for its fence ("" when none is known). */
export function languageOf(path: string): string {
  const extension = path.split(".").pop()?.toLowerCase() ?? "";
  return known(extension) ?? "";
}
