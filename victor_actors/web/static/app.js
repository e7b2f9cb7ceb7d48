// The victor_actors inspector page: plain DOM, no framework, no build step.
// Every request is a GET to the JSON routes of the same server; nothing on this page writes.
"use strict";

const PAGE = 100; // rows asked for per page of the tree, the search and the history

// -- small helpers ------------------------------------------------------------

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const $ = (id) => document.getElementById(id);

async function api(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") query.set(key, value);
  }
  const url = "/api/" + path + (query.toString() ? "?" + query : "");
  let response;
  let body;
  try {
    response = await fetch(url, { headers: { accept: "application/json" } });
  } catch (_err) {
    throw unreachable();
  }
  try {
    body = await response.json();
  } catch (_err) {
    throw new Error(`the inspector answered ${response.status} ${response.statusText} without JSON`);
  }
  if (!response.ok) {
    const err = new Error(body.error ? body.error.message : response.statusText);
    err.code = body.error ? body.error.code : "http_error";
    throw err;
  }
  return body;
}

// What the page says when its server is gone (the program serving it stopped, or the network).
function unreachable() {
  const err = new Error(
    `the inspector at ${location.host} does not answer: the program serving it has probably stopped. ` +
      "This page shows what it last read; reload it once the program runs again.",
  );
  err.code = "unreachable";
  return err;
}

function showError(err) {
  const box = $("error");
  box.textContent = err ? String(err.message || err) : "";
  box.dataset.code = err && err.code ? err.code : "";
  box.hidden = !err;
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  if (n < 1024) return n + " B";
  if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1024 / 1024).toFixed(1) + " MiB";
}

const when = (iso) => (iso ? iso.replace("T", " ") : "-");
const shortWhen = (iso) => (iso ? iso.replace("T", " ").replace(/\.\d+Z$/, "") : "-");

function json(value) {
  return JSON.stringify(value);
}

function scopeHash(ref, extra) {
  const params = new URLSearchParams({ scope: ref });
  for (const [key, value] of Object.entries(extra || {})) {
    if (value !== null && value !== undefined) params.set(key, value);
  }
  return "#" + params.toString();
}

function route() {
  return new URLSearchParams(location.hash.slice(1));
}

// -- the tree and the search --------------------------------------------------

let listSeq = 0; // answers to an older search are dropped
let flatCursor = null;

function scopeCells(item, depth) {
  const name = el("td", { class: "name" });
  name.style.paddingLeft = 0.4 + depth * 1.2 + "em";
  if (depth >= 0 && item.has_children) {
    name.append(el("button", { class: "toggle", type: "button", text: "+", title: "show children" }));
  } else if (depth >= 0) {
    name.append(el("span", { class: "toggle-space" }));
  }
  name.append(el("a", { class: "scope-link", href: scopeHash(item.ref), text: item.ref }));
  if (item.unreadable) name.append(el("span", { class: "bad", text: " unreadable", title: item.unreadable }));
  return [
    name,
    el("td", { class: "num version", text: item.version ?? "-" }),
    el("td", { class: "num size", text: bytes(item.size) }),
    el("td", { class: "last", text: shortWhen(item.last_commit), title: item.last_commit || "" }),
  ];
}

function scopeRow(item, depth) {
  const row = el("tr", { class: "scope-row", "data-ref": item.ref, "data-depth": String(depth) }, ...scopeCells(item, depth));
  const toggle = row.querySelector(".toggle");
  if (toggle) toggle.addEventListener("click", () => (row.dataset.open ? collapse(row) : expand(row)));
  if (route().get("scope") === item.ref) row.classList.add("selected");
  return row;
}

function moreRow(parentRef, depth, after) {
  const button = el("button", { type: "button", class: "more-children", text: "more" });
  const row = el("tr", { class: "more-row", "data-depth": String(depth) }, el("td", { colSpan: 4 }, button));
  row.querySelector(".more-children").style.marginLeft = 0.4 + depth * 1.2 + "em";
  button.addEventListener("click", async () => {
    try {
      await insertChildren(parentRef, depth, after, row);
      row.remove();
    } catch (err) {
      showError(err);
    }
  });
  return row;
}

async function insertChildren(parentRef, depth, after, before) {
  const page = await api("scopes", { parent: parentRef, after, limit: PAGE });
  const rows = [];
  for (const item of page.items) rows.push(scopeRow(item, depth));
  if (page.next) rows.push(moreRow(parentRef, depth, page.next));
  before.before(...rows);
  return rows;
}

function descendants(row) {
  const depth = Number(row.dataset.depth);
  const out = [];
  for (let next = row.nextElementSibling; next && Number(next.dataset.depth) > depth; next = next.nextElementSibling) {
    out.push(next);
  }
  return out;
}

async function expand(row, auto) {
  row.dataset.open = "1";
  const toggle = row.querySelector(".toggle");
  if (toggle) toggle.textContent = "-";
  const marker = el("tr", { "data-depth": "-1" });
  row.after(marker);
  try {
    const rows = await insertChildren(row.dataset.ref, Number(row.dataset.depth) + 1, null, marker);
    if (auto) {
      for (const child of rows) {
        if (child.querySelector(".toggle") && $("tree").tBodies[0].rows.length < 60 && Number(child.dataset.depth) < 4) {
          await expand(child, true);
        }
      }
    }
  } finally {
    marker.remove();
  }
}

function collapse(row) {
  delete row.dataset.open;
  const toggle = row.querySelector(".toggle");
  if (toggle) toggle.textContent = "+";
  for (const child of descendants(row)) child.remove();
}

async function loadTree() {
  const seq = ++listSeq;
  const body = $("tree").tBodies[0];
  const prefix = $("search").value.trim();
  const level = $("level").value;
  $("more").hidden = true;
  try {
    if (prefix || level) {
      flatCursor = null;
      const page = await api("scopes", { prefix, level, limit: PAGE });
      if (seq !== listSeq) return;
      body.replaceChildren(...page.items.map((item) => scopeRow(item, -1)));
      if (!page.items.length) body.append(el("tr", { class: "empty" }, el("td", { colSpan: 4, text: "no scope matches" })));
      flatCursor = page.next;
      $("more").hidden = !page.next;
    } else {
      const page = await api("scopes", { parent: "none", limit: PAGE });
      if (seq !== listSeq) return;
      body.replaceChildren(...page.items.map((item) => scopeRow(item, 0)));
      if (page.next) body.append(moreRow("none", 0, page.next));
      for (const row of Array.from(body.rows)) {
        if (row.querySelector(".toggle")) await expand(row, true);
      }
    }
    showError(null);
  } catch (err) {
    showError(err);
  }
}

async function moreFlat() {
  const page = await api("scopes", { prefix: $("search").value.trim(), level: $("level").value, after: flatCursor, limit: PAGE });
  $("tree").tBodies[0].append(...page.items.map((item) => scopeRow(item, -1)));
  flatCursor = page.next;
  $("more").hidden = !page.next;
}

// -- one scope ----------------------------------------------------------------

let current = null; // {ref, historyBefore, messagesFrom}

function summaryItem(term, value) {
  return [el("dt", { text: term }), el("dd", {}, value)];
}

async function loadScope(ref) {
  $("placeholder").hidden = true;
  $("scope").hidden = false;
  for (const row of document.querySelectorAll("#tree .scope-row")) {
    row.classList.toggle("selected", row.dataset.ref === ref);
  }
  const params = route();
  const run = params.get("run") || null;
  const sameScope = current && current.ref === ref;
  if (!sameScope) {
    current = { ref, run };
    $("scope-title").textContent = ref;
    $("history").tBodies[0].replaceChildren();
    $("diff").hidden = true;
    showSummary(await api("scope", { ref }));
    await Promise.all([loadHistory(null), loadCheckpoints()]);
  } else if (current.run !== run) {
    current.run = run;
    $("history").tBodies[0].replaceChildren();
    await loadHistory(null);
  }
  await loadVersion(params.get("v"));
  if (params.get("a") && params.get("b")) await loadDiff(params.get("a"), params.get("b"));
}

function showSummary(info) {
  current.stored = info.version;
  current.liveVersion = info.live ? info.live.version : null;
  const items = [
    ...summaryItem("level", info.level),
    ...summaryItem("parent", info.parent ? el("a", { href: scopeHash(info.parent), text: info.parent }) : "none"),
    ...summaryItem("version", el("span", { class: "scope-version", text: String(info.version) })),
    ...summaryItem("last commit", when(info.last_commit)),
    ...summaryItem("created", when(info.created)),
  ];
  if (info.size !== undefined) items.push(...summaryItem("stored", bytes(info.size)));
  if (info.log) {
    const span = info.log.count ? `v${info.log.first} to v${info.log.last}` : "empty";
    items.push(...summaryItem("log", `${info.log.count} commits (${span})`));
    items.push(...summaryItem("checkpoints", String(info.checkpoints)));
  }
  if (info.live) {
    items.push(...summaryItem("owner's version", el("span", { class: "live-version", text: String(info.live.version) })));
    items.push(...summaryItem("actor", info.live.is_live ? "running" : "passivated"));
  }
  $("scope-summary").replaceChildren(...items);
}

// In live mode the open scope follows the commits: its summary, the new rows of its history, its
// checkpoints, and its state and conversation when the current version is on show.
async function refreshScope() {
  if (!current) return;
  const ref = current.ref;
  const info = await api("scope", { ref });
  if (!current || current.ref !== ref) return;
  const liveVersion = info.live ? info.live.version : null;
  if (info.version === current.stored && liveVersion === current.liveVersion) return;
  showSummary(info);
  await Promise.all([newHistoryRows(), loadCheckpoints()]);
  if (!route().get("v")) await loadVersion(null);
}

function historyRow(ref, item, checked) {
  const v = String(item.version);
  const cells = [
    el("td", {}, el("input", { type: "radio", name: "a", value: v, checked: checked.a === v })),
    el("td", {}, el("input", { type: "radio", name: "b", value: v, checked: checked.b === v })),
    el("td", { class: "num" }, el("a", { class: "version-link", href: scopeHash(ref, { v, run: current.run }), text: "v" + v })),
  ];
  if (!item.in_log) {
    cells.push(el("td", { colSpan: 5, class: "note", text: "commit no longer in the log" }));
  } else if (item.unreadable) {
    cells.push(el("td", { colSpan: 5, class: "bad", text: "unreadable: " + item.unreadable }));
  } else {
    const kinds = Object.entries(item.transitions).map(([name, n]) => `${name} x${n}`).join(", ");
    const kind = item.rollback ? "rollback" : item.kind === "reset" ? "restore" : item.kind;
    const run = item.run_id
      ? el("a", { class: "run-link", href: scopeHash(ref, { run: item.run_id }), text: item.run_id, title: "this run's commits" })
      : "-";
    cells.push(
      el("td", { class: "time", text: when(item.time) }),
      el("td", { class: "run" }, run),
      el("td", { class: "kind", text: kind }),
      el("td", { class: "transitions", text: item.kind === "reset" ? item.summary : kinds || "none" }),
      el("td", { class: "keys", text: item.changed_keys.join(", ") }),
    );
  }
  cells.push(el("td", { class: "mark", text: item.checkpoint ? "checkpoint" + (item.checkpoint.label ? " " + item.checkpoint.label : "") : "" }));
  return el("tr", { class: "commit" + (item.rollback ? " rollback" : ""), "data-version": v }, ...cells);
}

function historyTitle(page) {
  const count = `(${page.count} commits in the log)`;
  if (!current.run) {
    $("history-count").replaceChildren(count);
    return;
  }
  $("history-count").replaceChildren(
    `${count}; the commits of run ${current.run} `,
    el("a", { class: "all-commits", href: scopeHash(current.ref), text: "show every commit" }),
  );
}

function pickedNow() {
  const params = route();
  return { a: picked("a") ?? params.get("a"), b: picked("b") ?? params.get("b") };
}

async function loadHistory(before) {
  const ref = current.ref;
  const run = current.run;
  const page = await api("history", { ref, before, limit: PAGE, run });
  if (!current || current.ref !== ref || current.run !== run) return;
  const checked = pickedNow();
  $("history").tBodies[0].append(...page.items.map((item) => historyRow(ref, item, checked)));
  if (before === null && !page.items.length) {
    $("history").tBodies[0].append(el("tr", { class: "empty" }, el("td", { colSpan: 9, class: "note", text: run ? "no commit of this run is in the log" : "no commits" })));
  }
  historyTitle(page);
  current.historyBefore = page.next_before;
  $("history-more").hidden = page.next_before === null;
}

// The commits newer than the newest row on show go on top (all of them again, if more than a
// page arrived); the rows on show, and the versions picked for a diff, stay.
async function newHistoryRows() {
  const ref = current.ref;
  const run = current.run;
  const page = await api("history", { ref, limit: PAGE, run });
  if (!current || current.ref !== ref || current.run !== run) return;
  const body = $("history").tBodies[0];
  const shown = Array.from(body.querySelectorAll("tr.commit")).map((row) => Number(row.dataset.version));
  const top = shown.length ? Math.max(...shown) : 0;
  const fresh = page.items.filter((item) => item.version > top);
  const checked = pickedNow();
  if (fresh.length === page.items.length && page.next_before !== null) {
    body.replaceChildren(...page.items.map((item) => historyRow(ref, item, checked)));
    current.historyBefore = page.next_before;
    $("history-more").hidden = false;
  } else if (fresh.length) {
    for (const row of body.querySelectorAll("tr.empty")) row.remove();
    body.prepend(...fresh.map((item) => historyRow(ref, item, checked)));
  }
  historyTitle(page);
}

function picked(name) {
  const input = document.querySelector(`#history input[name="${name}"]:checked`);
  return input ? input.value : null;
}

function valueCell(value, present) {
  return el("td", { class: "value" + (present ? "" : " absent") }, present ? el("code", { text: json(value) }) : "");
}

function diffMapTable(title, section, a, b) {
  const wrap = el("div", { class: "diff-section" }, el("h4", { text: `${title}: ${section.changed} changed, ${section.unchanged} unchanged` }));
  if (!section.rows.length) return wrap;
  const head = el("tr", {}, el("th", { text: "key" }), el("th", { text: "v" + a }), el("th", { text: "v" + b }));
  const rows = section.rows.map((row) =>
    el(
      "tr",
      { class: "diff-row " + row.change, "data-key": row.key },
      el("td", { class: "key" }, el("span", { class: "sign", text: { added: "+", removed: "-", changed: "~" }[row.change] }), " " + row.key),
      valueCell(row.old, row.change !== "added"),
      valueCell(row.new, row.change !== "removed"),
    ),
  );
  wrap.append(el("table", { class: "grid diff-table" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  return wrap;
}

async function loadDiff(a, b) {
  const ref = current.ref;
  const d = await api("diff", { ref, a, b });
  if (!current || current.ref !== ref) return;
  $("diff").hidden = false;
  $("diff-title").textContent = `Diff v${d.a} -> v${d.b}`;
  const m = d.messages;
  const messages = el(
    "div",
    { class: "diff-section" },
    el("h4", {
      text:
        `messages: ${m.added_count} added` +
        (m.removed ? `, ${m.removed} no longer present` : "") +
        ` (${m.old_count} -> ${m.new_count})`,
    }),
  );
  if (m.added.length || m.removed_messages.length) {
    const plural = (n) => (n === 1 ? "1 message" : `${n} messages`);
    const left = m.removed_messages.length
      ? m.removed_messages.map((msg, i) => message(msg, m.common + i))
      : [el("p", { class: "note", text: `v${d.a} has ${plural(m.old_count)}, all still in v${d.b}` })];
    const right = m.added.length
      ? m.added.map((msg, i) => message(msg, m.first_added_index + i))
      : [el("p", { class: "note", text: `v${d.b} adds no message` })];
    messages.append(
      el(
        "div",
        { class: "side-by-side" },
        el("div", { class: "column" }, el("h5", { text: `only in v${d.a}` }), el("div", { class: "conversation removed-messages" }, ...left)),
        el("div", { class: "column" }, el("h5", { text: `only in v${d.b}` }), el("div", { class: "conversation added-messages" }, ...right)),
      ),
    );
  }
  const flags = el(
    "table",
    { class: "grid diff-table" },
    el("thead", {}, el("tr", {}, el("th", {}), el("th", { text: "v" + d.a }), el("th", { text: "v" + d.b }))),
    el(
      "tbody",
      {},
      el("tr", { class: "diff-row " + (d.stage.old === d.stage.new ? "same" : "changed") }, el("td", { text: "stage" }), el("td", { text: d.stage.old }), el("td", { text: d.stage.new })),
      el("tr", { class: "diff-row " + (d.closed.old === d.closed.new ? "same" : "changed") }, el("td", { text: "closed" }), el("td", { text: String(d.closed.old) }), el("td", { text: String(d.closed.new) })),
    ),
  );
  $("diff-body").replaceChildren(
    diffMapTable("state", d.state, d.a, d.b),
    messages,
    diffMapTable("capabilities", d.capabilities, d.a, d.b),
    el("div", { class: "diff-section" }, flags),
  );
}

function message(msg, index) {
  const isMap = msg && typeof msg === "object" && !Array.isArray(msg);
  const role = isMap && typeof msg.role === "string" ? msg.role : "message";
  const node = el("div", { class: "message role-" + role.replace(/[^a-z0-9_-]/gi, "_"), "data-index": String(index) });
  node.append(el("div", { class: "role", text: `${role}  #${index}` }));
  if (!isMap) {
    node.append(el("pre", { class: "content", text: json(msg) }));
    return node;
  }
  if ("content" in msg) {
    const content = msg.content;
    node.append(el("pre", { class: "content", text: typeof content === "string" ? content : JSON.stringify(content, null, 2) }));
  }
  const rest = Object.entries(msg).filter(([key]) => key !== "role" && key !== "content");
  if (rest.length) {
    node.append(el("div", { class: "meta" }, ...rest.map(([key, value]) => el("span", { class: "field" }, el("b", { text: key }), " " + (typeof value === "string" ? value : json(value))))));
  }
  return node;
}

async function loadVersion(v) {
  const ref = current.ref;
  const s = await api("state", { ref, version: v });
  if (!current || current.ref !== ref) return;
  current.messagesFrom = s.messages_from;
  current.version = s.version;
  $("version-title").textContent = `State at v${s.version}` + (v === null ? " (current)" : "");
  const rows = s.state.map((item) => el("tr", {}, el("td", { class: "key", text: item.key }), el("td", { class: "value" }, el("code", { text: json(item.value) }))));
  const more = s.state_count > s.state.length ? el("p", { class: "note", text: `${s.state_count - s.state.length} more keys not shown` }) : null;
  const facts = el(
    "p",
    { class: "facts" },
    `stage ${s.conversation_stage}; ${s.closed ? "closed" : "open"}; capabilities ${json(s.capabilities)}; ` +
      `${Object.keys(s.pending_tool_requests).length} pending tool requests`,
  );
  const table = rows.length
    ? el("table", { class: "grid state-table" }, el("thead", {}, el("tr", {}, el("th", { text: "key" }), el("th", { text: "value" }))), el("tbody", {}, ...rows))
    : el("p", { class: "note", text: "no keys" });
  $("state-body").replaceChildren(...[facts, table, more].filter((node) => node !== null));
  $("conversation-count").textContent = `(${s.message_count} messages at v${s.version}` + (s.messages_from ? `, showing from #${s.messages_from}` : "") + ")";
  $("conversation").replaceChildren(...s.messages.map((msg, i) => message(msg, s.messages_from + i)));
  if (!s.messages.length) $("conversation").append(el("p", { class: "note", text: "no messages" }));
  $("earlier").hidden = s.messages_from === 0;
}

async function earlier() {
  const ref = current.ref;
  const from = Math.max(0, current.messagesFrom - PAGE);
  const s = await api("state", { ref, version: current.version, messages_from: from, messages_limit: current.messagesFrom - from });
  if (!current || current.ref !== ref) return;
  $("conversation").prepend(...s.messages.map((msg, i) => message(msg, from + i)));
  current.messagesFrom = from;
  $("earlier").hidden = from === 0;
}

async function loadCheckpoints() {
  const ref = current.ref;
  const page = await api("checkpoints", { ref });
  if (!current || current.ref !== ref) return;
  const rows = page.items.map((c) =>
    el(
      "tr",
      { class: c.readable ? "" : "bad" },
      el("td", { text: c.id }),
      el("td", { class: "num" }, el("a", { href: scopeHash(ref, { v: c.version }), text: "v" + c.version })),
      el("td", { text: c.label || "-" }),
      el("td", { text: c.readable ? when(c.time) : "unreadable" }),
      el("td", { class: "num", text: bytes(c.size) }),
    ),
  );
  $("checkpoints").tBodies[0].replaceChildren(...rows);
  if (!rows.length) $("checkpoints").tBodies[0].append(el("tr", {}, el("td", { colSpan: 5, class: "note", text: "no checkpoints" })));
}

// -- live mode ------------------------------------------------------------------

function fill(id, rows) {
  $(id).tBodies[0].replaceChildren(...rows);
}

// A run's scopes, each a link to the run's commits in that scope (its writes and its rollback).
function runScopes(run) {
  const cell = el("td", { class: "run-scopes" });
  run.scopes.forEach((ref, i) => {
    if (i) cell.append(", ");
    cell.append(el("a", { class: "run-scope", href: scopeHash(ref, { run: run.id }), text: ref, "data-ref": ref }));
  });
  if (!run.scopes.length) cell.append("-");
  return cell;
}

function showLive(data) {
  const s = data.stats;
  $("live-commits").textContent = String(s.commits);
  $("live-rate").textContent = String(data.commits_per_second);
  $("live-actors").textContent = `${s.live_actors} (peak ${s.peak_live_actors})`;
  $("live-scopes").textContent = `${s.scopes} (${s.passivated_scopes} passivated)`;
  $("live-mailbox").textContent = String(s.mailbox_depth_max);
  $("live-queued").textContent = String(s.events_queued);
  $("live-failures").textContent = String(s.failures);
  $("live-restarts").textContent = String(s.restarts);
  $("live-runs").textContent = String(data.runs.in_progress.length);
  $("live-rolled-back").textContent = String(data.runs.outcomes.rolled_back || 0);
  fill(
    "runs-active",
    data.runs.in_progress.map((r) =>
      el("tr", { class: "run-row", "data-run": r.id }, el("td", { text: r.id }), el("td", { class: "num", text: r.age_seconds.toFixed(2) }), el("td", { class: "num", text: r.remaining_seconds === undefined ? "-" : r.remaining_seconds.toFixed(2) }), runScopes(r)),
    ),
  );
  fill(
    "runs-finished",
    data.runs.finished
      .slice()
      .reverse()
      .map((r) => el("tr", { class: "run-row " + r.status, "data-run": r.id }, el("td", { text: r.id }), el("td", { class: "outcome", text: r.status.replace("_", " ") }), runScopes(r), el("td", { text: r.reason || "-" }), el("td", { class: "time", text: shortWhen(r.ended) }))),
  );
  fill(
    "supervision",
    data.supervision.recent
      .slice()
      .reverse()
      .map((e) => el("tr", { class: "event " + e.kind, "data-seq": String(e.seq) }, el("td", { text: when(e.time) }), el("td", { class: "kind", text: e.kind }), el("td", { text: e.ref }), el("td", { text: e.reason }))),
  );
}

// In live mode the versions in the tree follow the commits: the rows on show are asked for again
// (their parents' first pages, at most one round at a time and one every two seconds).
let treeRefresh = { busy: false, at: 0, commits: null };

async function refreshVisibleRows() {
  const byRef = new Map(Array.from(document.querySelectorAll("#tree .scope-row")).map((row) => [row.dataset.ref, row]));
  const prefix = $("search").value.trim();
  const level = $("level").value;
  const asks = [];
  if (prefix || level) {
    asks.push({ prefix, level, limit: PAGE });
  } else {
    asks.push({ parent: "none", limit: PAGE });
    for (const row of byRef.values()) if (row.dataset.open && asks.length < 20) asks.push({ parent: row.dataset.ref, limit: PAGE });
  }
  for (const params of asks) {
    const page = await api("scopes", params);
    for (const item of page.items) {
      const row = byRef.get(item.ref);
      if (!row) continue;
      row.querySelector(".version").textContent = item.version ?? "-";
      row.querySelector(".size").textContent = bytes(item.size);
      row.querySelector(".last").textContent = shortWhen(item.last_commit);
    }
  }
}

function followCommits(commits) {
  const now = Date.now();
  if (treeRefresh.busy || commits === treeRefresh.commits || now - treeRefresh.at < 2000) return;
  treeRefresh = { busy: true, at: now, commits };
  Promise.all([refreshVisibleRows(), refreshScope()])
    .catch(showError)
    .finally(() => {
      treeRefresh.busy = false;
    });
}

function liveStatus(text, bad) {
  $("live-status").textContent = text;
  $("live-status").classList.toggle("bad", Boolean(bad));
}

function startLive() {
  $("live").hidden = false;
  const source = new EventSource("/api/live/events");
  source.addEventListener("live", (event) => {
    liveStatus("live");
    if ($("error").dataset.code === "unreachable") showError(null); // back again
    const data = JSON.parse(event.data);
    showLive(data);
    followCommits(data.stats.commits);
  });
  source.addEventListener("closed", () => {
    liveStatus("the manager closed: this page shows what it last read", true);
    source.close();
  });
  source.onerror = () => {
    // The browser tries again by itself; meanwhile say what happened, in words.
    liveStatus("disconnected: the program serving this page has probably stopped; trying again", true);
  };
}

// -- start ------------------------------------------------------------------------

async function onRoute() {
  const ref = route().get("scope");
  if (!ref) return;
  try {
    await loadScope(ref);
    showError(null);
  } catch (err) {
    showError(err);
  }
}

async function start() {
  $("search").addEventListener("input", loadTree);
  $("level").addEventListener("change", loadTree);
  $("refresh").addEventListener("click", () => {
    loadTree();
    if (current) {
      const ref = current.ref;
      current = null;
      loadScope(ref).catch(showError);
    }
  });
  $("more").addEventListener("click", () => moreFlat().catch(showError));
  $("history-more").addEventListener("click", () => loadHistory(current.historyBefore).catch(showError));
  $("earlier").addEventListener("click", () => earlier().catch(showError));
  $("compare").addEventListener("click", () => {
    const a = picked("a");
    const b = picked("b");
    if (a === null || b === null) {
      showError(new Error("pick an A and a B version in the history first"));
      return;
    }
    const params = route();
    params.set("a", a);
    params.set("b", b);
    location.hash = params.toString();
  });
  window.addEventListener("hashchange", onRoute);
  try {
    const info = await api("info");
    $("mode").textContent = info.mode === "live" ? "live" : "store";
    $("mode").classList.add(info.mode);
    $("store-path").textContent = info.store || "in memory";
    if (info.mode === "live") startLive();
  } catch (err) {
    showError(err);
  }
  await loadTree();
  await onRoute();
  document.body.dataset.ready = "1";
}

document.addEventListener("DOMContentLoaded", start);
