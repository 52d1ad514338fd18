// Building the page: elements from plain data, never from HTML strings, so text the API
// returns (file names, messages, model answers) is always shown as text.

const SVG_NS = "http://www.w3.org/2000/svg";

function applyProps(node, props) {
  for (const [name, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
    else if (name === "value" && "value" in node) node.value = value;
    else if (name === "checked" || name === "selected" || name === "disabled" || name === "hidden") node[name] = true;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** An HTML element: h("a", {href: "#/jobs"}, "Jobs"). */
export function h(tag, props, ...children) {
  const node = document.createElement(tag);
  applyProps(node, props);
  append(node, children);
  return node;
}

/** An SVG element. */
export function s(tag, props, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value !== undefined && value !== null) node.setAttribute(name, String(value));
  }
  append(node, children);
  return node;
}

/** Replace what `node` holds. */
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

let uniqueCounter = 0;
/** An id no other element of the page has. */
export function uid(prefix = "f") {
  uniqueCounter += 1;
  return `${prefix}-${uniqueCounter}`;
}

/** A labelled form control with optional help text tied to it by aria-describedby. */
export function field(label, control, help) {
  control.id = control.id || uid("in");
  const parts = [h("label", {for: control.id}, label), control];
  if (help) {
    const helpId = uid("help");
    control.setAttribute("aria-describedby", helpId);
    parts.push(h("small", {id: helpId, class: "help"}, help));
  }
  return h("div", {class: "field"}, parts);
}

/** A <select> of [value, text] pairs (or plain values). */
export function dropdown(options, props = {}) {
  const node = h("select", props);
  for (const option of options) {
    const [value, text] = Array.isArray(option) ? option : [option, option];
    node.append(h("option", {value}, text));
  }
  if (props.value !== undefined) node.value = props.value;
  return node;
}

/** A table with a caption (visually hidden when `hideCaption`) and one row per item. */
export function table(caption, headers, rows, {hideCaption = false, testid} = {}) {
  return h("table", {class: "grid", "data-testid": testid},
    h("caption", {class: hideCaption ? "visually-hidden" : null}, caption),
    h("thead", null, h("tr", null, headers.map((text) => h("th", {scope: "col"}, text)))),
    h("tbody", null, rows.map((cells) => h("tr", null, cells.map((cell) => h("td", null, cell))))));
}

/** A definition list of [term, value] pairs. */
export function facts(pairs, props = {}) {
  return h("dl", {class: "facts", ...props},
    pairs.filter(([, value]) => value !== undefined).map(([term, value]) => [h("dt", null, term), h("dd", null, value ?? "—")]));
}

export function section(title, ...children) {
  const headingId = uid("sec");
  return h("section", {class: "panel", "aria-labelledby": headingId}, h("h2", {id: headingId}, title), children);
}

export function formatTime(unixSeconds) {
  if (unixSeconds === null || unixSeconds === undefined) return "—";
  const date = new Date(unixSeconds * 1000);
  return date.toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

export function formatNumber(value, digits = 4) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  const magnitude = Math.abs(value);
  if (magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e6)) return value.toExponential(2);
  return String(Number(value.toPrecision(digits)));
}

export function formatValue(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "number") return formatNumber(value);
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

export function statusBadge(status) {
  return h("span", {class: `badge status-${status}`, "data-testid": "status-badge"}, status);
}
