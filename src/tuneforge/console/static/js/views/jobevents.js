// A job's events panel: newest first, a page at a time (the API's `after`/`limit` paging),
// the events the stream brings while the page is open added on top; filtered by level, type
// and text; `metrics` reports (one a step) summarised in one line per run unless asked for.

import {get} from "../api.js";
import {h, dropdown, field, formatTime, uid} from "../dom.js";

export const EVENTS_PAGE_SIZE = 50;
// What the panel holds at most: the oldest drop off (and can be loaded again) past it.
const MAX_EVENTS_HELD = 5000;
const LEVELS = [["", "All levels"], ["info", "info"], ["warn", "warn"], ["error", "error"]];

function plural(count, word) {
  return `${count} ${word}${count === 1 ? "" : "s"}`;
}

/** One line for a run of metrics reports (newest first): the steps they cover. */
function metricsSummary(run) {
  const steps = run.map((event) => (event.data || {}).step).filter((step) => typeof step === "number");
  const span = steps.length ? `Steps ${Math.min(...steps)}–${Math.max(...steps)}: ` : "";
  return h("li", {class: "event summary", "data-testid": "metrics-summary", "data-count": String(run.length)},
    `${span}${plural(run.length, "metrics report")} (see the charts)`);
}

function eventLine(event) {
  const level = event.level || "info";
  return h("li", {class: `event level-${level}`, "data-event-id": event.id, "data-type": event.type, "data-level": level},
    h("time", null, formatTime(event.created_at)), " ",
    h("span", {class: "event-level"}, level), " ",
    h("span", {class: "event-type mono"}, event.type), " ",
    h("span", {class: "event-message"}, event.message));
}

export function eventsPanel(jobId) {
  let held = [];  // newest first
  let hasOlder = false;
  const list = h("ol", {class: "events", "data-testid": "event-list"});
  const count = h("span", {class: "muted", "data-testid": "event-count"}, "No events yet");
  const levelFilter = dropdown(LEVELS, {"data-testid": "event-level-filter"});
  const typeFilter = dropdown([["", "All types"]], {"data-testid": "event-type-filter"});
  const textFilter = h("input", {type: "search", "data-testid": "event-text-filter", placeholder: "words in the message"});
  const showMetrics = h("input", {type: "checkbox", id: uid("metrics"), "data-testid": "event-show-metrics"});
  const older = h("button", {type: "button", class: "secondary small", "data-testid": "events-older", hidden: true},
    `Load ${EVENTS_PAGE_SIZE} older events`);

  function matches(event) {
    const text = textFilter.value.trim().toLowerCase();
    return (!levelFilter.value || (event.level || "info") === levelFilter.value) &&
      (!typeFilter.value || event.type === typeFilter.value) &&
      (!text || `${event.message} ${event.type}`.toLowerCase().includes(text));
  }

  function refreshTypes() {
    const types = [...new Set(held.map((event) => event.type))].sort();
    const chosen = typeFilter.value;
    const known = [...typeFilter.options].map((option) => option.value).slice(1);
    if (types.length === known.length && types.every((type, index) => type === known[index])) return;
    typeFilter.replaceChildren(h("option", {value: ""}, "All types"), ...types.map((type) => h("option", {value: type}, type)));
    typeFilter.value = types.includes(chosen) ? chosen : "";
  }

  function draw() {
    refreshTypes();
    const shown = held.filter(matches);
    const lines = [];
    let run = [];
    for (const event of shown) {
      if (event.type === "metrics" && !showMetrics.checked) {
        run.push(event);
        continue;
      }
      if (run.length) lines.push(metricsSummary(run));
      run = [];
      lines.push(eventLine(event));
    }
    if (run.length) lines.push(metricsSummary(run));
    list.replaceChildren(...lines);
    const metrics = held.filter((event) => event.type === "metrics").length;
    count.textContent = `Showing ${shown.length} of ${plural(held.length, "loaded event")} · ${metrics} metric reports` +
      (hasOlder ? " · older events not loaded" : "");
    count.dataset.loaded = String(held.length);
    older.hidden = !hasOlder;
  }

  /** A page of the API's list (newest first), after what is held. */
  function addPage(page) {
    const seen = new Set(held.map((event) => event.id));
    held = held.concat(page.data.filter((event) => !seen.has(event.id)));
    hasOlder = Boolean(page.has_more) && page.data.length > 0;
    draw();
  }

  /** Events the stream brought (oldest first), newer than anything held. */
  function addLive(events) {
    held = events.slice().reverse().concat(held);
    if (held.length > MAX_EVENTS_HELD) {
      held = held.slice(0, MAX_EVENTS_HELD);
      hasOlder = true;
    }
    draw();
  }

  async function loadOlder() {
    const last = held[held.length - 1];
    addPage(await get(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/events`,
      {limit: EVENTS_PAGE_SIZE, after: last ? last.id : undefined}));
  }

  for (const control of [levelFilter, typeFilter, showMetrics]) control.addEventListener("change", draw);
  textFilter.addEventListener("input", draw);

  const filters = h("div", {class: "filters event-filters"},
    field("Level", levelFilter), field("Type", typeFilter), field("Message contains", textFilter),
    h("div", {class: "field checkbox"}, showMetrics, h("label", {for: showMetrics.id}, "Show each metrics report")));
  const element = [filters, count,
    h("div", {class: "scroll-box", tabindex: "0", role: "region", "aria-label": "Job events, newest first"}, list),
    h("div", {class: "actions more"}, older)];
  return {element, addPage, addLive, loadOlder, older, draw};
}
