// Ballast's web view: keeps the live part of the page current and sends
// the operator's actions to the REST API. No framework, no bundler.
"use strict";

const live = document.getElementById("live");
const notice = document.getElementById("notice");
const connection = document.getElementById("connection");
const token = document.getElementById("token");

token.value = sessionStorage.getItem("ballast-token") || "";
token.addEventListener("change", () => sessionStorage.setItem("ballast-token", token.value));
document.getElementById("token-form").addEventListener("submit", (e) => e.preventDefault());

// What the operator is typing survives a refresh: values that differ from
// what the page was rendered with, and the focus.
function keepInputs(from, into) {
  for (const el of from.querySelectorAll("input[id], select[id]")) {
    const changed = el.tagName === "SELECT"
      ? !el.options[el.selectedIndex]?.defaultSelected
      : el.value !== el.defaultValue;
    const twin = into.querySelector("#" + CSS.escape(el.id));
    if (changed && twin) twin.value = el.value;
  }
}

let fetching = false;
let again = false;
async function refresh() {
  if (fetching) { again = true; return; }
  fetching = true;
  try {
    const resp = await fetch("/ui/live", { cache: "no-store" });
    if (!resp.ok) {
      connection.textContent = "Could not refresh: " + resp.status + " " + resp.statusText;
    } else {
      const next = document.createElement("div");
      next.innerHTML = await resp.text();
      keepInputs(live, next);
      const focused = document.activeElement && live.contains(document.activeElement)
        ? document.activeElement.id : null;
      live.replaceChildren(...next.childNodes);
      if (focused) document.getElementById(focused)?.focus();
      connection.textContent = "Live";
    }
  } catch (e) {
    connection.textContent = "Could not refresh: " + e;
  } finally {
    fetching = false;
    if (again) { again = false; refresh(); }
  }
}

function listen() {
  const events = new EventSource("/ui/events");
  events.addEventListener("open", () => { connection.textContent = "Live"; refresh(); });
  events.addEventListener("change", refresh);
  events.addEventListener("error", () => { connection.textContent = "Reconnecting to the controller…"; });
}

function say(text, ok) {
  notice.textContent = text;
  notice.className = ok ? "ok" : "bad";
}

// Sends one change to the REST API; its error, if any, is shown as the
// API words it.
async function send(method, url, body) {
  const headers = { "Content-Type": "application/json" };
  if (token.value) headers["Authorization"] = "Bearer " + token.value;
  try {
    const resp = await fetch(url, { method, headers, body: JSON.stringify(body) });
    if (resp.ok) {
      say(method + " " + url + ": done", true);
    } else {
      let why = resp.status + " " + resp.statusText;
      try {
        const j = await resp.json();
        if (j.error) why = j.error;
      } catch (_) { /* not JSON */ }
      say(method + " " + url + ": " + why, false);
    }
  } catch (e) {
    say(method + " " + url + ": the controller did not answer (" + e + ")", false);
  }
  refresh();
}

live.addEventListener("click", (e) => {
  const b = e.target.closest("button[data-url]");
  if (!b) return;
  send(b.dataset.method, b.dataset.url, JSON.parse(b.dataset.body));
});

live.addEventListener("submit", (e) => {
  const f = e.target.closest("form[data-method]");
  if (!f) return;
  e.preventDefault();
  const raw = f.elements["value"].value;
  let value = raw;
  if (f.dataset.type === "number") {
    value = Number(raw);
    if (raw.trim() === "" || !Number.isInteger(value)) {
      say(f.dataset.field + ": " + JSON.stringify(raw) + " is not a whole number", false);
      return;
    }
  }
  const url = f.dataset.url || f.dataset.urlPrefix + encodeURIComponent(f.elements["name"].value);
  send(f.dataset.method, url, { [f.dataset.field]: value });
});

// Picking a setting shows its value, to edit.
live.addEventListener("change", (e) => {
  if (e.target.id !== "setting-name") return;
  const opt = e.target.options[e.target.selectedIndex];
  document.getElementById("setting-value").value = opt.dataset.value;
});

listen();
