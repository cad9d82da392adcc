// A small JavaScript highlighter for the codec editor: a textarea laid over
// a <pre> holding the same text as coloured spans. Keywords, strings,
// numbers and comments are enough to read a codec; nothing is evaluated.

const KEYWORDS = new Set(("break case catch class const continue default delete do else export " +
  "false finally for function if in instanceof let new null return switch this throw true try " +
  "typeof undefined var void while").split(" "));

const TOKEN = /(\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$))|("(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|`(?:[^`\\]|\\.)*`?)|(\b(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:e[+-]?\d+)?)\b)|([A-Za-z_$][\w$]*)/g;

function escape(s) {
  return s.replace(/[&<>]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" })[c]);
}

/** `code` as HTML with token spans (text escaped). */
export function highlight(code) {
  let out = "";
  let last = 0;
  for (const m of code.matchAll(TOKEN)) {
    out += escape(code.slice(last, m.index));
    const [text, comment, string, number, word] = m;
    let cls = null;
    if (comment) cls = "tok-c";
    else if (string) cls = "tok-s";
    else if (number) cls = "tok-n";
    else if (word && KEYWORDS.has(word)) cls = "tok-k";
    out += cls ? `<span class="${cls}">${escape(text)}</span>` : escape(text);
    last = m.index + text.length;
  }
  return out + escape(code.slice(last)) + "\n";
}

/**
 * An editor: a labelled textarea over its highlighted copy, kept in step
 * on input and scroll. Tab inserts two spaces; Escape then Tab leaves.
 * Answers {element, textarea, get(), set(text)}.
 */
export function codeEditor(id, label, text = "") {
  const pre = document.createElement("pre");
  pre.setAttribute("aria-hidden", "true");
  const ta = document.createElement("textarea");
  ta.id = id;
  ta.spellcheck = false;
  ta.setAttribute("autocapitalize", "off");
  ta.setAttribute("aria-label", label);
  ta.className = "code";
  const box = document.createElement("div");
  box.className = "editor";
  box.append(pre, ta);
  let trapTab = true;
  const sync = () => { pre.innerHTML = highlight(ta.value); pre.scrollTop = ta.scrollTop; pre.scrollLeft = ta.scrollLeft; };
  ta.addEventListener("input", sync);
  ta.addEventListener("scroll", () => { pre.scrollTop = ta.scrollTop; pre.scrollLeft = ta.scrollLeft; });
  ta.addEventListener("keydown", (e) => {
    if (e.key === "Escape") { trapTab = false; return; }
    if (e.key === "Tab" && trapTab && !e.shiftKey) {
      e.preventDefault();
      ta.setRangeText("  ", ta.selectionStart, ta.selectionEnd, "end");
      sync();
    }
  });
  ta.addEventListener("focus", () => { trapTab = true; });
  const set = (t) => { ta.value = t; sync(); };
  set(text);
  return { element: box, textarea: ta, get: () => ta.value, set };
}
