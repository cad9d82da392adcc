// The console's entry: signs in, routes `#/…` to a screen, and tears a
// screen's live streams and timers down when another one opens.
import { apiKey, setApiKey, get, ApiError } from "./api.js";
import { h, fill, errorBox, showError, title } from "./ui.js";
import overview from "./views/overview.js";
import devices from "./views/devices.js";
import device from "./views/device.js";
import types from "./views/types.js";
import rules from "./views/rules.js";
import alarms from "./views/alarms.js";
import entities from "./views/entities.js";
import subscriptions from "./views/subscriptions.js";
import channels from "./views/channels.js";
import pages from "./views/pages.js";

const main = document.getElementById("main");

/** Routes: the first path segment names the screen; the rest is its argument. */
const ROUTES = {
  "": overview, devices, device, types, rules, alarms, entities, subscriptions, channels, pages,
};

/** What the open screen asked to be closed when it is left (streams, timers). */
let cleanups = [];

/** Given to each screen: register something to close when leaving it. */
function onLeave(fn) { cleanups.push(fn); }

function leave() {
  for (const fn of cleanups) { try { fn(); } catch { /* closing */ } }
  cleanups = [];
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = raw.split("?");
  const parts = path.split("/").map(decodeURIComponent);
  return { name: parts[0] || "", arg: parts.slice(1).join("/"), params: new URLSearchParams(query) };
}

let signedIn = false;

async function route() {
  leave();
  if (!signedIn) return;
  const { name, arg, params } = parseHash();
  const view = ROUTES[name];
  for (const a of document.querySelectorAll("nav a")) {
    const target = a.getAttribute("href").replace(/^#\/?/, "");
    const current = target === name || (name === "device" && target === "devices");
    if (current) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  document.getElementById("nav").classList.remove("open");
  if (!view) { fill(main, title("Not found"), h("p", {}, "No such screen.")); return; }
  fill(main, h("p", { class: "muted" }, "Loading…"));
  try {
    await view(main, { arg, params, onLeave });
  } catch (e) {
    fill(main, title("Error"), errorBox(e));
  }
}

/** The sign-in form: asks for an API key and checks it against the server. */
function signIn(message) {
  leave();
  signedIn = false;
  document.getElementById("sign-out").hidden = true;
  document.getElementById("who").textContent = "";
  const key = h("input", { id: "api-key", type: "password", autocomplete: "current-password", required: true, size: 40 });
  const remember = h("input", { id: "remember", type: "checkbox" });
  const err = errorBox(message ? new Error(message) : null);
  const form = h("form", { class: "card signin", id: "sign-in" },
    h("p", {}, "Sign in with an API key (weft prints the first admin key when it starts; see docs/security.md)."),
    h("label", { for: "api-key" }, "API key", key),
    h("label", { class: "inline" }, remember, "Remember on this browser"),
    err,
    h("p", {}, h("button", { class: "primary", type: "submit" }, "Sign in")));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    setApiKey(key.value.trim(), remember.checked);
    try {
      await probe();
      enter();
    } catch (x) {
      setApiKey("", false);
      showError(err, x.status === 401 ? new Error("This key is not valid (unknown, expired or revoked).") : x);
    }
  });
  fill(main, title("Sign in"), form);
  key.focus();
}

/** Whether the server lets this browser in (with its key, or without when auth is off). */
async function probe() {
  await get("/api/v1/device-types");
}

function enter() {
  signedIn = true;
  const key = apiKey();
  document.getElementById("who").textContent = key ? `key ${key.slice(0, 9)}…` : "no key (authentication off)";
  document.getElementById("sign-out").hidden = !key;
  route();
}

window.addEventListener("hashchange", route);
window.addEventListener("weft:unauthorized", () => { if (signedIn) signIn("Your key was refused; sign in again."); });
document.getElementById("sign-out").addEventListener("click", () => { setApiKey("", false); signIn(); });
document.getElementById("menu-toggle").addEventListener("click", (e) => {
  const nav = document.getElementById("nav");
  const open = nav.classList.toggle("open");
  e.currentTarget.setAttribute("aria-expanded", String(open));
});

(async () => {
  try {
    await probe();
    enter();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) signIn();
    else fill(main, title("weft is not reachable"), errorBox(e));
  }
})();
