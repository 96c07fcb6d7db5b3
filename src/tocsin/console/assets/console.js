// The Tocsin console: views over the public API of the origin that served this page.
// Plain DOM, no framework and no build: each view builds its frame once and returns a
// refresh that reloads its data, called again every POLL_MS while the view is open.
"use strict";

const POLL_MS = 2000;
const SCHEDULES_EVERY_MS = 15000; // schedules' next occurrences change slowly
// What a view reads at most, page after page: a page of the API is up to 100 tasks and one
// request; the views stay under a second with 10,000 tasks stored (`tocsin bench --scenarios
// console`). A filtered listing reads past what the filter skips, so its pages are shorter.
const MOST_ROWS = 200;
const FAILED_PAGE = 25;
const TYPES = ["webhook", "lambda", "eventbridge", "sqs", "sns", "email"];
const WINDOWS = [["5 min", 300], ["1 h", 3600], ["6 h", 21600], ["24 h", 86400]];
const MASKED = /secret|token|password|authorization|signature|api[-_]?key/i;
const SVG_NS = "http://www.w3.org/2000/svg";

// -- the page's small tools --------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  return build(document.createElement(tag), attrs, children);
}

function s(tag, attrs = {}, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

function build(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined) element.append(child);
  }
  return element;
}

class ApiError extends Error {
  constructor(status, error) {
    super(error.message || `HTTP ${status}`);
    Object.assign(this, { status, code: error.code, field: error.field });
  }
}

async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const reply = await fetch(path, init);
  const data = await reply.json().catch(() => null);
  if (!reply.ok) throw new ApiError(reply.status, (data && (data.error || data)) || {});
  return data;
}

// Up to `most` items of a listing, following its `next` tokens.
async function listing(path, params, most = MOST_ROWS) {
  let items = [];
  let next = null;
  do {
    const query = new URLSearchParams(params);
    if (next) query.set("next", next);
    const page = await api("GET", `${path}?${query}`);
    items = items.concat(page.tasks || page.schedules);
    next = page.next;
  } while (next && items.length < most);
  return { items: items.slice(0, most), more: Boolean(next) || items.length > most };
}

// The API's refusal, as it told it; one that a refresh met goes when a refresh succeeds.
function showError(error, from = "action") {
  const box = document.getElementById("error");
  box.hidden = !error;
  box.dataset.from = error ? from : "";
  if (!error) return;
  const code = error.code ? `${error.code}: ` : "";
  box.textContent = `${error.status ? `${error.status} ` : ""}${code}${error.message}`;
}

const ms = (iso) => Date.parse(iso);
const iso = (time) => new Date(time).toISOString();
const shown = (value) => (value ? value.replace("T", " ") : "–");
const pathOf = (kind, id) => `/${kind}/${encodeURIComponent(id)}`;
const link = (kind, id) => h("a", { href: `#${pathOf(kind, id)}` }, id);
const statusCell = (status) => h("td", { class: `status-${status}` }, status);

function seconds(time) {
  const left = (time - Date.now()) / 1000;
  return left >= 0 ? `in ${left.toFixed(1)} s` : `${(-left).toFixed(1)} s ago`;
}

function percentile(sorted, p) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

function table(headings, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, headings.map((t) => h("th", {}, t)))),
    h("tbody", {}, rows));
}

function swatch(type) {
  return h("span", { class: `swatch type-${type}` }); // no inline style: the page's CSP
}

function masked(value, key = "") {
  if (key === "headers" && value && typeof value === "object") {
    return Object.fromEntries(Object.keys(value).map((name) => [name, "•••"]));
  }
  if (MASKED.test(key) && value !== null && typeof value !== "object") return "•••";
  if (Array.isArray(value)) return value.map((item) => masked(item));
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, masked(v, k)]));
  }
  return value;
}

// -- Upcoming: what fires next, on a time axis -------------------------------------------

function upcoming(root, _, params) {
  const windowS = Number(params.get("window")) || 300;
  const toolbar = h("div", { class: "toolbar" }, h("span", { class: "muted" }, "next"),
    WINDOWS.map(([label, value]) => h("button", {
      class: value === windowS ? "current" : null,
      onclick: () => { location.hash = `#/upcoming?window=${value}`; },
    }, label)));
  const legend = h("div", { class: "legend muted" },
    TYPES.map((type) => h("span", {}, swatch(type), type)),
    h("span", {}, "○ a schedule's occurrence not yet a task"));
  const summary = h("p", { class: "muted", id: "upcoming-summary" });
  const chart = h("div");
  const rows = h("div");
  root.append(h("h1", {}, "Upcoming"), toolbar, legend, summary, chart, rows);
  let occurrences = [];
  let occurrencesAt = 0;
  let nowLine = null;
  let span = null;

  const moveNow = () => {
    if (nowLine && span) nowLine.setAttribute("transform", `translate(${span.x(Date.now())},0)`);
  };
  const ticking = setInterval(moveNow, 200);

  async function refresh() {
    const now = Date.now();
    const until = now + windowS * 1000;
    // not yet fired: PENDING, or RUNNING in the seconds between its claim and its fire
    const params = { due_after: iso(now - 2000), due_before: iso(until), limit: 100 };
    const fresh = now - occurrencesAt > SCHEDULES_EVERY_MS;
    const [tasks, made] = await Promise.all([listing("/tasks", params),
      fresh ? scheduleOccurrences() : occurrences]);
    tasks.items = tasks.items.filter((task) => ["PENDING", "RUNNING"].includes(task.status));
    if (fresh) [occurrences, occurrencesAt] = [made, now];
    const taskDue = new Set(tasks.items.map((task) => ms(task.due_at)));
    const pending = occurrences.filter((o) => o.at <= until && o.at > now && !taskDue.has(o.at));
    span = axis(now - windowS * 20, until);
    const more = tasks.more ? ` (the first ${tasks.items.length} shown)` : "";
    summary.textContent = `${tasks.items.length} tasks due in the next ${label(windowS)}${more}; ` +
      `${pending.length} schedule occurrences not yet made tasks.`;
    nowLine = s("g", {}, s("line", { class: "now", x1: 0, x2: 0, y1: 4, y2: 150 }),
      s("text", { x: 3, y: 12 }, "now"));
    chart.replaceChildren(timeline(span, tasks.items, pending, nowLine));
    moveNow();
    rows.replaceChildren(table(["id", "type", "due at (UTC)", "", "version"],
      tasks.items.slice(0, 200).map((task) => h("tr", {},
        h("td", {}, link("task", task.id)), h("td", {}, swatch(task.type), task.type),
        h("td", {}, shown(task.due_at)), h("td", { class: "muted" }, seconds(ms(task.due_at))),
        h("td", {}, task.version)))));
  }
  refresh.stop = () => clearInterval(ticking);
  return refresh;
}

function label(windowS) {
  return (WINDOWS.find(([, value]) => value === windowS) || [`${windowS} s`])[0];
}

async function scheduleOccurrences() {
  const schedules = await listing("/schedules", { limit: 100 }, 100);
  const enabled = schedules.items.filter((schedule) => schedule.state === "ENABLED").slice(0, 20);
  const answers = await Promise.all(enabled.map((schedule) =>
    api("GET", `${pathOf("schedules", schedule.id)}/upcoming?count=10`)
      .then((reply) => reply.occurrences.map((at) => ({ at: ms(at), schedule }))),
  ));
  return answers.flat();
}

function axis(from, until, width = 1000) {
  const pad = 40;
  return { from, until, width, x: (time) => pad + ((time - from) / (until - from)) * (width - 2 * pad) };
}

function timeline(span, tasks, occurrences, nowLine) {
  const lanes = Object.fromEntries(TYPES.map((type, i) => [type, 24 + i * 20]));
  const svg = s("svg", { viewBox: `0 0 ${span.width} 160`, width: "100%", role: "img",
    "aria-label": "tasks due on a time axis" });
  for (let i = 0; i <= 5; i += 1) {
    const time = span.from + ((span.until - span.from) * i) / 5;
    const x = span.x(time);
    svg.append(s("line", { class: "axis", x1: x, x2: x, y1: 16, y2: 146 }),
      s("text", { x, y: 158, "text-anchor": "middle" }, iso(time).slice(11, 19)));
  }
  const seconds = new Map(); // a burst: the tasks of one type due in one second
  for (const task of tasks) {
    const key = `${task.type}@${Math.floor(ms(task.due_at) / 1000)}`;
    const group = seconds.get(key) || { type: task.type, at: ms(task.due_at), ids: [] };
    group.ids.push(task.id);
    seconds.set(key, group);
  }
  for (const group of seconds.values()) {
    const x = span.x(group.at);
    const y = lanes[group.type];
    const title = s("title", {}, `${group.ids.length} ${group.type} due ${iso(group.at)}: ` +
      group.ids.slice(0, 5).join(", ") + (group.ids.length > 5 ? ", ..." : ""));
    const mark = s("circle", { cx: x, cy: y, r: group.ids.length > 1 ? 6 : 4,
      class: `due type-${group.type}`, "data-task": group.ids[0] }, title);
    svg.append(mark);
    if (group.ids.length > 1) svg.append(s("text", { x: x + 8, y: y + 4 }, `×${group.ids.length}`));
  }
  for (const occurrence of occurrences) {
    const type = occurrence.schedule.type;
    svg.append(s("circle", { cx: span.x(occurrence.at), cy: lanes[type], r: 4,
      class: `occurrence type-${type}` }, s("title", {}, `${occurrence.schedule.id} ${iso(occurrence.at)}`)));
  }
  svg.append(nowLine);
  return svg;
}

// -- Recent: what fired, failed or was cancelled, and how late ----------------------------

const ENDED = ["SUCCEEDED", "FAILED", "CANCELLED"];

function recent(root, _, params) {
  const wanted = {
    status: params.get("status") || "", type: params.get("type") || "",
    schedule: params.get("schedule") || "",
  };
  const go = (changes) => {
    const next = new URLSearchParams({ ...wanted, ...changes });
    for (const [name, value] of [...next]) if (!value) next.delete(name);
    location.hash = `#/recent?${next}`;
  };
  const choice = (name, options) => h("select", { name, onchange: (e) => go({ [name]: e.target.value }) },
    ["", ...options].map((value) => h("option", { value, selected: value === wanted[name] }, value || `any ${name}`)));
  const scheduleBox = h("input", { name: "schedule", placeholder: "schedule id", value: wanted.schedule,
    onchange: (e) => go({ schedule: e.target.value.trim() }) });
  const idBox = h("input", { name: "id", placeholder: "open a task by id",
    onchange: (e) => { location.hash = `#${pathOf("task", e.target.value.trim())}`; } });
  const stats = h("div", { class: "stats" });
  const charts = h("div", { class: "charts" });
  const rows = h("div");
  root.append(h("h1", {}, "Recent"),
    h("div", { class: "toolbar" }, choice("status", ENDED), choice("type", TYPES), scheduleBox, idBox),
    stats, charts, rows);

  return async function refresh() {
    const query = { order: "desc", due_before: iso(Date.now() + 1000), limit: 100 };
    if (wanted.status) query.status = wanted.status;
    if (wanted.schedule) query.schedule = wanted.schedule;
    const read = await listing("/tasks", query, 200);
    const tasks = read.items.filter((task) => ENDED.includes(task.status) &&
      (!wanted.type || task.type === wanted.type));
    const fired = tasks.filter((task) => task.status === "SUCCEEDED" && task.lateness_ms != null);
    const lateness = fired.map((task) => task.lateness_ms).sort((a, b) => a - b);
    const early = lateness.filter((value) => value < 0).length;
    const figure = (name, value) => h("span", {}, `${name} `, h("b", {}, value ?? "–"));
    stats.replaceChildren(
      figure("shown", tasks.length + (read.more ? "+" : "")), figure("fired", fired.length),
      figure("p50", lateness.length ? `${percentile(lateness, 50)} ms` : null),
      figure("p90", lateness.length ? `${percentile(lateness, 90)} ms` : null),
      figure("p99", lateness.length ? `${percentile(lateness, 99)} ms` : null),
      figure("max", lateness.length ? `${lateness[lateness.length - 1]} ms` : null),
      h("span", { id: "early" }, `early: ${early}`,
        h("span", { class: "muted" }, early ? " (fired before their due time!)" : " (none fired before its due time)")));
    charts.replaceChildren(histogram(lateness), overTime(fired));
    rows.replaceChildren(table(["id", "status", "type", "due at (UTC)", "fired at", "lateness", "attempts", "error"],
      tasks.slice(0, 300).map((task) => h("tr", {},
        h("td", {}, link("task", task.id)), statusCell(task.status), h("td", {}, swatch(task.type), task.type),
        h("td", {}, shown(task.due_at)), h("td", {}, shown(task.fired_at)),
        h("td", {}, task.lateness_ms == null ? "–" : `${task.lateness_ms} ms`),
        h("td", {}, `${task.attempts}/${task.max_attempts}`),
        h("td", { class: "wrap" }, task.error ? task.error.message || task.error.code : "")))));
  };
}

const BINS = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000];

function histogram(lateness) {
  const counts = new Array(BINS.length + 1).fill(0); // [early, 0-1, 1-2, ..., 1000+]
  for (const value of lateness) {
    counts[value < 0 ? 0 : BINS.findLastIndex((edge) => value >= edge) + 1] += 1;
  }
  const names = ["early", ...BINS.map((edge, i) => (i + 1 < BINS.length ? `${edge}` : `${edge}+`))];
  const top = Math.max(1, ...counts);
  const svg = s("svg", { width: 520, height: 190, role: "img", "aria-label": "lateness histogram, ms" },
    s("text", { x: 8, y: 14 }, "lateness, ms (tasks fired; each bar from its edge to the next)"));
  counts.forEach((count, i) => {
    const x = 10 + i * 42;
    const height = (count / top) * 130;
    svg.append(s("rect", { x, y: 155 - height, width: 36, height, fill: i === 0 ? "#b42318" : "#2b59c3" }),
      s("text", { x: x + 18, y: 150 - height, "text-anchor": "middle" }, count || ""),
      s("text", { x: x + 18, y: 172, "text-anchor": "middle" }, names[i]));
  });
  return svg;
}

function overTime(fired) {
  const svg = s("svg", { width: 520, height: 190, role: "img", "aria-label": "lateness percentiles over time" },
    s("text", { x: 8, y: 14 }, "p50 / p90 / p99 lateness, ms, by due time"));
  if (!fired.length) return svg;
  const times = fired.map((task) => ms(task.due_at));
  const from = Math.min(...times);
  const until = Math.max(...times) + 1;
  const step = Math.max(1000, Math.ceil((until - from) / 30 / 1000) * 1000);
  const buckets = new Map();
  for (const task of fired) {
    const at = from + Math.floor((ms(task.due_at) - from) / step) * step;
    buckets.set(at, [...(buckets.get(at) || []), task.lateness_ms]);
  }
  const points = [...buckets.entries()].sort((a, b) => a[0] - b[0])
    .map(([at, values]) => [at, values.sort((a, b) => a - b)]);
  const top = Math.max(1, ...points.map(([, values]) => percentile(values, 99)));
  const x = (at) => 40 + ((at - from) / Math.max(1, until - from)) * 460;
  const y = (value) => 160 - (Math.max(0, value) / top) * 130;
  svg.append(s("text", { x: 4, y: 34 }, `${top}`), s("text", { x: 4, y: 160 }, "0"),
    s("text", { x: 40, y: 178 }, iso(from).slice(11, 19)),
    s("text", { x: 500, y: 178, "text-anchor": "end" }, iso(until).slice(11, 19)));
  [[50, "#98a2b3"], [90, "#2b59c3"], [99, "#b42318"]].forEach(([p, colour]) => {
    const line = points.map(([at, values]) => `${x(at)},${y(percentile(values, p))}`).join(" ");
    svg.append(s("polyline", { points: line, fill: "none", stroke: colour, "stroke-width": 1.5 },
      s("title", {}, `p${p}`)));
  });
  return svg;
}

// -- Failed: failed tasks with their errors, retried where the owner may --------------------

function failed(root) {
  const rows = h("div");
  let most = FAILED_PAGE;
  const more = h("button", { name: "more", hidden: true,
    onclick: () => { most += FAILED_PAGE; refreshNow(); } }, "Show more");
  const held = h("div");
  root.append(h("h1", {}, "Failed"), held,
    h("p", { class: "muted" }, "Retry fires a task again at once, as its next version."), rows, more);
  return async function refresh() {
    const query = { status: "FAILED", order: "desc", due_before: iso(Date.now() + 1000), limit: FAILED_PAGE };
    const [read, targets] = await Promise.all([listing("/tasks", query, most), api("GET", "/targets")]);
    held.replaceChildren(...(targets.held.length ? [h("h2", {}, "Hosts held back"),
      h("p", { class: "muted" }, "Each failed again and again: one task probes it while the others wait, counting no attempt, until it answers."),
      table(["host", "type", "held since (UTC)", "failures in a row", "waiting", "last error"],
        targets.held.map((host) => h("tr", {}, h("td", {}, host.host), h("td", {}, swatch(host.task_type), host.task_type),
          h("td", {}, shown(host.held_since)), h("td", {}, String(host.failures)), h("td", {}, String(host.waiting)),
          h("td", { class: "wrap" }, host.last_error || ""))))] : []));
    more.hidden = !read.more;
    rows.replaceChildren(table(["id", "type", "due at (UTC)", "attempts", "error", ""],
      read.items.map((task) => h("tr", {},
        h("td", {}, link("task", task.id)), h("td", {}, swatch(task.type), task.type),
        h("td", {}, shown(task.due_at)), h("td", {}, `${task.attempts}/${task.max_attempts}`),
        h("td", { class: "wrap" }, task.error ? `${task.error.code || ""} ${task.error.message || ""}` : ""),
        h("td", {}, h("button", { "data-retry": task.id, onclick: () => act(() => api("POST", `${pathOf("tasks", task.id)}/retry`)) }, "Retry"))))));
  };
}

// -- Bulk: every task a filter matches cancelled or retried, asked first when many ---------

const HANDFUL = 5;

function bulk(root) {
  const action = h("select", { name: "action" },
    h("option", { value: "cancel" }, "Cancel"), h("option", { value: "retry" }, "Retry"));
  const tags = h("input", { name: "tags", size: 40, placeholder: "user=42, plan=trial" });
  const said = h("p", { id: "bulk-said" });
  const run = h("button", { name: "run", onclick: () => start() }, "Run");
  root.append(h("h1", {}, "Bulk"),
    h("p", { class: "muted" }, "Cancel every task not yet fired that carries all these tags, and delete the schedules carrying them; or retry every failed one, at the stack's recovery rate."),
    h("p", {}, h("label", {}, "Action ", action), " ", h("label", {}, "Tags ", tags), " ", run), said);

  function filter() {
    const pairs = tags.value.split(",").map((pair) => pair.trim()).filter(Boolean)
      .map((pair) => [pair.slice(0, pair.indexOf("=")), pair.slice(pair.indexOf("=") + 1)]);
    return pairs.length ? { tags: Object.fromEntries(pairs) } : {};
  }
  async function followed(job) {
    while (job.state !== "DONE") {
      said.textContent = `${job.action}: matched ${job.matched}, done ${job.done}`;
      await new Promise((resolve) => setTimeout(resolve, 1000));
      job = await api("GET", `/bulk/${job.bulk_id}`);
    }
    return job;
  }
  async function start() {
    const body = { action: action.value, filter: filter() };
    run.disabled = true;
    try {
      if (body.action === "cancel") {
        const counted = await followed(await api("POST", "/bulk", { ...body, dry_run: true }));
        if (counted.matched > HANDFUL &&
            !confirm(`Cancel ${counted.matched} tasks, and the schedules carrying these tags?`)) {
          said.textContent = "nothing cancelled";
          return;
        }
      }
      const done = await followed(await api("POST", "/bulk", body));
      const schedules = done.action === "cancel" ? `, schedules deleted ${done.schedules_deleted}` : "";
      said.textContent = `${done.action}: matched ${done.matched}, done ${done.done}, failed ${done.failed}${schedules}`;
      showError(null);
    } catch (error) {
      showError(error);
    } finally {
      run.disabled = false;
    }
  }
  return async function refresh() {};
}

// An action's request; its refusal is shown as the API told it, and the view refreshes.
async function act(request) {
  try {
    await request();
    showError(null);
  } catch (error) {
    showError(error);
    return false;
  }
  await refreshNow();
  return true;
}

// -- Task: one task's life -------------------------------------------------------------

function task(root, id) {
  const path = pathOf("tasks", id);
  const when = h("input", { name: "due", placeholder: "+30s, +5m or 2030-01-01T09:00:00Z", size: 32 });
  const body = (text) => {
    const relative = /^\+(\d+(?:\.\d+)?)(s|m|h)$/.exec(text.trim());
    return relative ? { delay: Number(relative[1]) * { s: 1, m: 60, h: 3600 }[relative[2]] } : { due_at: text.trim() };
  };
  const retry = h("button", { name: "retry", hidden: true, onclick: () => act(() => api("POST", `${path}/retry`)) }, "Retry");
  const actions = h("div", { class: "actions" },
    h("button", { name: "cancel", onclick: () => act(() => api("DELETE", path)) }, "Cancel"),
    when, h("button", { name: "reschedule", onclick: () => act(() => api("PATCH", path, body(when.value))) }, "Reschedule"),
    retry);
  const facts = h("div");
  const life = h("div");
  const content = h("div");
  root.append(h("h1", {}, "Task ", h("code", {}, id)), actions, facts, life, content);

  return async function refresh() {
    const task = await api("GET", path);
    retry.hidden = task.status !== "FAILED";
    const fields = [["status", h("span", { id: "status", class: `status-${task.status}` }, task.status)],
      ["type", task.type], ["version", task.version], ["due at", shown(task.due_at)],
      ["fired at", shown(task.fired_at)],
      ["lateness", task.lateness_ms == null ? "–" : `${task.lateness_ms} ms`],
      ...flowFields(task),
      ["attempts", `${task.attempts} of ${task.max_attempts}`
        + (task.exhausted_by ? ` (stopped by ${task.exhausted_by})` : "")],
      ...(task.next_attempt_at ? [["next attempt", h("span", { id: "next-attempt" }, shown(task.next_attempt_at))]] : []),
      ["created at", shown(task.created_at)],
      ["updated at", shown(task.updated_at)], ["execution", task.execution || "– (not claimed)"]];
    if (task.error) fields.push(["error", `${task.error.code || ""}: ${task.error.message || ""}`]);
    if (task.result !== undefined && task.result !== null) fields.push(["result", JSON.stringify(task.result)]);
    if (task.callback_of) fields.push(["callback of", link("task", task.callback_of)]);
    facts.replaceChildren(h("dl", {}, fields.map(([name, value]) => [h("dt", {}, name), h("dd", {}, value)])));
    life.replaceChildren(h("h2", {}, "Life"), lifeAxis(task), h("h2", {}, "Attempts"),
      table(["#", "began (UTC)", "outcome"], attemptRows(task).map(([n, at, outcome]) =>
        h("tr", { class: "attempt" }, h("td", {}, n), h("td", {}, shown(at)), h("td", { class: "wrap" }, outcome)))));
    content.replaceChildren(h("h2", {}, "Target (header values and secrets masked)"),
      h("pre", {}, JSON.stringify(masked(task.target), null, 2)),
      h("h2", {}, "Payload"), h("pre", {}, JSON.stringify(task.payload, null, 2)),
      ...callbacks(task));
  };
}

// A task's flow: its limits, and, once its flow holds it past its due time, when it fires
// (held, while it waits) and for how long it was held.
function flowFields(task) {
  if (!task.flow) return [];
  const limits = [["rate", "/s"], ["parallelism", " in flight"]]
    .filter(([name]) => task.flow[name] != null).map(([name, unit]) => `${task.flow[name]}${unit}`);
  const fields = [["flow", `${task.flow.key}: ${limits.join(", ")}`]];
  if (task.planned_at) {
    const waiting = task.status === "RUNNING" && !task.fired_at;
    fields.push([waiting ? "held until" : "planned at", h("span", { id: "planned" }, shown(task.planned_at))]);
  }
  if (task.held_ms != null) fields.push(["held", `${task.held_ms} ms by its flow`]);
  return fields;
}

// Who is told the outcome (masked as the target is), and the callback once it is made.
function callbacks(task) {
  return [["on_success", "On success", "SUCCEEDED"], ["on_failure", "On failure", "FAILED"]]
    .filter(([name]) => task[name])
    .flatMap(([name, title, status]) => [
      h("h2", {}, `${title}: ${task[name].type}`),
      h("pre", { class: name }, JSON.stringify(masked(task[name].target), null, 2)),
      ...(task.status === status ? [h("p", {}, "told by ", link("task", `${task.id}.${task.version}.callback`))] : []),
    ]);
}

// Each attempt: the ones that failed (`tries`, with their errors), then the one that sent.
function attemptRows(task) {
  // the item keeps the latest failed attempts only: numbered from the count made
  const tries = task.tries || [];
  const first = (task.fired_at ? task.attempts - 1 : task.attempts) - tries.length + 1;
  const rows = tries.map((one, i) => [first + i, one.at, `failed: ${one.error}`]);
  if (task.fired_at) rows.push([task.attempts, task.fired_at, `sent, ${task.lateness_ms} ms late`]);
  return rows;
}

function lifeAxis(task) {
  const moments = [["submitted", task.created_at], ["due", task.due_at]];
  if (task.planned_at) moments.push([task.fired_at ? "planned" : "held until", task.planned_at]);
  for (const [n, at, outcome] of attemptRows(task)) {
    moments.push([outcome.startsWith("failed") ? `attempt ${n} failed` : `fired (attempt ${n})`, at]);
  }
  if (task.next_attempt_at) moments.push(["next attempt", task.next_attempt_at]);
  if (task.status === "CANCELLED" && task.updated_at) moments.push(["cancelled", task.updated_at]);
  else if (!["SUCCEEDED", "FAILED"].includes(task.status)) moments.push(["now", iso(Date.now())]);
  moments.sort((a, b) => ms(a[1]) - ms(b[1]));
  const times = moments.map(([, at]) => ms(at));
  const span = axis(Math.min(...times), Math.max(...times) + 1, 900);
  const svg = s("svg", { viewBox: "0 0 900 86", width: "100%", role: "img", "aria-label": "the task's life" },
    s("line", { class: "axis", x1: 40, x2: 860, y1: 42, y2: 42 }));
  const rows = [[16, -Infinity], [62, -Infinity], [30, -Infinity], [78, -Infinity]]; // y, last end
  for (const [name, at] of moments) {
    const x = span.x(ms(at));
    const text = `${name} ${at.slice(11, 23)}`;
    const width = text.length * 6.2; // about 11 px type
    const anchor = x < 150 ? "start" : x > 750 ? "end" : "middle";
    const left = anchor === "start" ? x : anchor === "end" ? x - width : x - width / 2;
    const row = rows.find(([, end]) => end + 8 <= left) || rows[rows.length - 1]; // a free row
    row[1] = left + width;
    svg.append(s("circle", { cx: x, cy: 42, r: 5, fill: name.endsWith("failed") ? "#b42318" : "#2b59c3" }),
      s("text", { x, y: row[0], "text-anchor": anchor }, text));
  }
  return svg;
}

// -- Schedules --------------------------------------------------------------------------

function schedules(root) {
  const rows = h("div");
  root.append(h("h1", {}, "Schedules"), rows);
  return async function refresh() {
    const read = await listing("/schedules", { limit: 100 }, 500);
    rows.replaceChildren(table(["id", "expression", "time zone", "state", "next due (UTC)", "last fired", "occurrences", "missed", "catch-up"],
      read.items.map((one) => h("tr", {},
        h("td", {}, link("schedule", one.id)), h("td", {}, h("code", {}, one.expression)),
        h("td", {}, one.timezone), h("td", {}, one.state), h("td", {}, shown(one.next_due_at)),
        h("td", {}, shown(one.last_fired_at)), h("td", {}, one.occurrences), h("td", {}, one.missed),
        h("td", {}, one.catch_up)))));
  };
}

function schedule(root, id) {
  const path = pathOf("schedules", id);
  const expression = h("input", { name: "expression", size: 28 });
  const zone = h("input", { name: "timezone", size: 18 });
  const toggle = h("button", { name: "toggle" });
  let state = null;
  toggle.addEventListener("click", () =>
    act(() => api("PATCH", path, { state: state === "PAUSED" ? "ENABLED" : "PAUSED" })));
  const remove = h("button", { name: "delete" }, "Delete");
  remove.addEventListener("click", () => {
    if (remove.dataset.armed) {
      act(() => api("DELETE", path)).then((done) => { if (done) location.hash = "#/schedules"; });
    }
    else Object.assign(remove, { textContent: "Delete: click again to confirm" }).dataset.armed = "1";
  });
  const save = () => act(() => api("PATCH", path, { expression: expression.value.trim(), timezone: zone.value.trim() }));
  const actions = h("div", { class: "actions" }, toggle, expression, zone,
    h("button", { name: "save", onclick: save }, "Save"), remove);
  const facts = h("div");
  const next = h("div");
  const runs = h("div");
  root.append(h("h1", {}, "Schedule ", h("code", {}, id)), actions, facts, next, runs);
  let filled = false;

  return async function refresh() {
    const one = await api("GET", path);
    // every read first, then the page drawn at once: never half of one refresh shown
    const lastRuns = new URLSearchParams({ schedule: id, order: "desc", due_before: iso(Date.now() + 1000), limit: 10 });
    const [upcomingTimes, last] = await Promise.all([
      one.state === "ENABLED" ? api("GET", `${path}/upcoming?count=10`).then((reply) => reply.occurrences) : [],
      api("GET", `/tasks?${lastRuns}`)]);
    state = one.state;
    toggle.textContent = one.state === "PAUSED" ? "Resume" : "Pause";
    if (!filled) { // the form keeps what the person types between refreshes
      [expression.value, zone.value, filled] = [one.expression, one.timezone, true];
    }
    facts.replaceChildren(h("dl", {},
      [["state", h("span", { id: "state" }, one.state)], ["expression", one.expression],
        ["time zone", one.timezone], ["type", one.type], ["catch-up", one.catch_up],
        ["occurrences", one.occurrences], ["missed", one.missed], ["revision", one.revision],
        ["next due", shown(one.next_due_at)], ["last fired", shown(one.last_fired_at)]]
        .map(([name, value]) => [h("dt", {}, name), h("dd", {}, value)])));
    next.replaceChildren(h("h2", {}, "Next 10 fire times (UTC)"),
      upcomingTimes.length ? h("ol", {}, upcomingTimes.map((at) => h("li", {}, shown(at))))
        : h("p", { class: "muted" }, `none: the schedule is ${one.state}`));
    runs.replaceChildren(h("h2", {}, "Last runs"), table(["task", "status", "due at", "lateness"],
      last.tasks.map((one) => h("tr", {}, h("td", {}, link("task", one.id)), statusCell(one.status),
        h("td", {}, shown(one.due_at)), h("td", {}, one.lateness_ms == null ? "–" : `${one.lateness_ms} ms`)))));
  };
}

// -- the router and the live loop -------------------------------------------------------

const VIEWS = { upcoming, recent, failed, bulk, schedules, task, schedule };
let current = null;

function route() {
  if (current && current.refresh.stop) current.refresh.stop();
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const [, name = "upcoming", arg = ""] = path.split("/");
  const view = VIEWS[name] ? name : "upcoming";
  const root = document.getElementById("view");
  root.replaceChildren();
  showError(null);
  for (const anchor of document.querySelectorAll("nav a")) {
    anchor.classList.toggle("current", anchor.dataset.view === view ||
      (anchor.dataset.view === "schedules" && view === "schedule"));
  }
  current = { refresh: VIEWS[view](root, decodeURIComponent(arg), new URLSearchParams(query)) };
  refreshNow();
}

async function refreshNow() {
  const running = current;
  try {
    await running.refresh();
    document.getElementById("live").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
    if (document.getElementById("error").dataset.from === "refresh") showError(null);
  } catch (error) {
    if (running === current) showError(error, "refresh");
  }
}

function poll() {
  setTimeout(async () => {
    if (!document.hidden && current) await refreshNow();
    poll();
  }, POLL_MS);
}

async function start() {
  try {
    const session = await api("GET", "/console/session");
    document.getElementById("session").textContent = `acting as ${session.principal} · API: ${session.api}`;
  } catch (error) {
    showError(error);
  }
  window.addEventListener("hashchange", route);
  route();
  poll();
}

start();
