// A small SVG line chart for per-step metrics. Points are appended as they arrive and the
// chart is redrawn in place: each series is one <polyline> whose `points` attribute grows,
// so a screen reader's summary (the <desc>) and the drawing always agree.
//
// Hovering (or, with the chart focused, the arrow keys) picks the step nearest the pointer: a
// guide line and a dot on each series mark it, and the readout under the caption gives the
// step and each series' value there. Smoothing (an exponential moving average, 0 = raw) draws
// a second, smoothed line over each series; the raw line stays, faint.

import {h, s, uid, formatNumber} from "./dom.js";

const WIDTH = 480;
const HEIGHT = 200;
const PAD = {left: 52, right: 18, top: 10, bottom: 28};
const PLOT_W = WIDTH - PAD.left - PAD.right;
const PLOT_H = HEIGHT - PAD.top - PAD.bottom;

/** About `count` round tick values from at or below `low` to at or above `high`. */
export function niceTicks(low, high, count = 4) {
  if (!Number.isFinite(low) || !Number.isFinite(high)) return [];
  if (low === high) {
    const spread = Math.abs(low) * 0.1 || 1;
    low -= spread;
    high += spread;
  }
  const rough = (high - low) / count;
  const magnitude = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((candidate) => candidate >= rough);
  const first = Math.floor(low / step + 1e-9);
  const last = Math.ceil(high / step - 1e-9);
  const ticks = [];
  for (let index = first; index <= last; index += 1) ticks.push(Number((index * step).toPrecision(12)));
  return ticks;
}

/**
 * The exponential moving average of `points` ([x, y] pairs) with weight `weight` on the past
 * (0 ≤ weight < 1; 0 returns the values unchanged). The average is divided by the weight its
 * terms carry so far, so the first points are not pulled towards zero.
 */
export function smoothed(points, weight) {
  if (!(weight > 0)) return points.slice();
  let average = 0;
  let mass = 0;
  return points.map(([x, y]) => {
    average = weight * average + (1 - weight) * y;
    mass = weight * mass + (1 - weight);
    return [x, average / mass];
  });
}

function lineOf(spec) {
  return s("polyline", {class: `series series-${spec.index}${spec.dashed ? " dashed" : ""}`, "data-series": spec.key,
    "data-points": "0", points: "", fill: "none"});
}

function smoothLineOf(spec) {
  return s("polyline", {class: `series smooth series-${spec.index}${spec.dashed ? " dashed" : ""}`,
    "data-smoothed-series": spec.key, points: "", fill: "none"});
}

function markerOf(spec) {
  return s("circle", {class: `marker series-${spec.index}`, r: 3, cx: -10, cy: -10});
}

function hoverDotOf(spec) {
  return s("circle", {class: `hover-dot series-${spec.index}`, r: 4, cx: -10, cy: -10, "data-hover-series": spec.key});
}

function legendOf(spec) {
  return h("li", null, h("span", {class: `swatch series-${spec.index}${spec.dashed ? " dashed" : ""}`}), spec.label);
}

/** The point of `points` (sorted by x) whose x is nearest `x`, or undefined. */
function nearest(points, x) {
  let best;
  for (const point of points) {
    if (best === undefined || Math.abs(point[0] - x) < Math.abs(best[0] - x)) best = point;
  }
  return best;
}

export class LineChart {
  /**
   * @param {string} name   what tests and styles know the chart by (data-chart)
   * @param {string} title  the visible caption
   * @param {{key: string, label: string, dashed?: boolean}[]} series
   */
  constructor(name, title, series) {
    this.name = name;
    this.title = title;
    this.weight = 0;
    this.hoverStep = null;
    this.scale = null;
    this.series = series.map((spec, index) => ({...spec, index, points: []}));
    const captionId = uid("chart");
    this.desc = s("desc", {id: uid("desc")});
    this.axes = s("g", {class: "axes"});
    this.lines = this.series.map(lineOf);
    this.smoothLines = this.series.map(smoothLineOf);
    this.markers = this.series.map(markerOf);
    this.guide = s("line", {class: "hover-guide hidden", x1: -10, x2: -10, y1: PAD.top, y2: HEIGHT - PAD.bottom});
    this.hoverDots = s("g", {class: "hover-dots hidden"}, this.series.map(hoverDotOf));
    this.empty = s("text", {x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle", class: "empty"}, "No points yet");
    // the area that listens to the pointer, drawn last so that it is on top
    this.hitArea = s("rect", {class: "hit-area", x: PAD.left, y: PAD.top, width: PLOT_W, height: PLOT_H});
    this.svg = s("svg", {viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-labelledby": captionId,
      "aria-describedby": this.desc.id, class: "chart-svg", tabindex: "0"},
    this.desc, this.axes, this.lines, this.smoothLines, this.markers, this.guide, this.hoverDots, this.empty, this.hitArea);
    this.legend = h("ul", {class: "legend", "aria-hidden": "true"}, this.series.map(legendOf));
    this.readout = h("p", {class: "readout muted", "data-testid": "chart-readout", "aria-live": "polite"}, "Point at the chart for values.");
    this.element = h("figure", {class: "chart", "data-chart": name},
      h("figcaption", {id: captionId}, title), this.readout, this.svg, this.legend);
    this.svg.addEventListener("pointermove", (event) => this.pointAt(event));
    this.svg.addEventListener("pointerleave", () => this.hover(null));
    this.svg.addEventListener("keydown", (event) => this.key(event));
    this.svg.addEventListener("blur", () => this.hover(null));
    this.render();
  }

  /** Another series, e.g. the validation figure of a method's own training figure, once it appears. */
  addSeries({key, label, dashed = false}) {
    if (this.series.some((candidate) => candidate.key === key)) return;
    const spec = {key, label, dashed, index: this.series.length, points: []};
    this.series.push(spec);
    this.lines.push(lineOf(spec));
    this.smoothLines.push(smoothLineOf(spec));
    this.markers.push(markerOf(spec));
    this.svg.insertBefore(this.lines[this.lines.length - 1], this.smoothLines[0]);
    this.svg.insertBefore(this.smoothLines[this.smoothLines.length - 1], this.markers[0]);
    this.svg.insertBefore(this.markers[this.markers.length - 1], this.guide);
    this.hoverDots.append(hoverDotOf(spec));
    this.legend.append(legendOf(spec));
  }

  /** Add the point (x, y) to series `key`; ignored when y is not a finite number. */
  add(key, x, y) {
    const spec = this.series.find((candidate) => candidate.key === key);
    if (!spec || typeof y !== "number" || !Number.isFinite(y) || typeof x !== "number") return false;
    spec.points.push([x, y]);
    return true;
  }

  count(key) {
    const spec = this.series.find((candidate) => candidate.key === key);
    return spec ? spec.points.length : 0;
  }

  /** The weight of the past in the moving average (0: raw values only); redraws. */
  setSmoothing(weight) {
    this.weight = Math.min(Math.max(Number(weight) || 0, 0), 0.99);
    this.render();
  }

  /** Every step any series has a point at, ascending. */
  steps() {
    return [...new Set(this.series.flatMap((spec) => spec.points.map(([x]) => x)))].sort((a, b) => a - b);
  }

  pointAt(event) {
    if (!this.scale) return;
    const box = this.svg.getBoundingClientRect();
    if (!box.width) return;
    const viewX = ((event.clientX - box.left) / box.width) * WIDTH;
    const step = nearest(this.steps().map((x) => [x]), this.scale.toX(viewX));
    this.hover(step ? step[0] : null);
  }

  key(event) {
    const steps = this.steps();
    if (!steps.length) return;
    const at = steps.indexOf(this.hoverStep);
    let next = null;
    if (event.key === "ArrowRight") next = steps[Math.min(at + 1, steps.length - 1)];
    else if (event.key === "ArrowLeft") next = steps[at === -1 ? steps.length - 1 : Math.max(at - 1, 0)];
    else if (event.key === "Home") next = steps[0];
    else if (event.key === "End") next = steps[steps.length - 1];
    else if (event.key === "Escape") this.hover(null);
    if (next === null) return;
    event.preventDefault();
    this.hover(next);
  }

  /** Mark step `step` (null: nothing) and say each series' value there. */
  hover(step) {
    this.hoverStep = step;
    const shown = step !== null && this.scale !== null;
    this.guide.classList.toggle("hidden", !shown);
    this.hoverDots.classList.toggle("hidden", !shown);
    this.element.toggleAttribute("data-hovering", shown);
    if (!shown) {
      this.readout.textContent = "Point at the chart for values.";
      delete this.readout.dataset.step;
      return;
    }
    const {px, py} = this.scale;
    this.guide.setAttribute("x1", px(step).toFixed(1));
    this.guide.setAttribute("x2", px(step).toFixed(1));
    const parts = [h("strong", null, `Step ${step}`)];
    this.series.forEach((spec, index) => {
      const dot = this.hoverDots.children[index];
      const at = spec.points.findIndex(([x]) => x === step);
      if (at === -1) {
        dot.setAttribute("cx", -10);
        dot.setAttribute("cy", -10);
        return;
      }
      const raw = spec.points[at][1];
      const drawn = this.weight > 0 ? smoothed(spec.points, this.weight)[at][1] : raw;
      dot.setAttribute("cx", px(step).toFixed(1));
      dot.setAttribute("cy", py(drawn).toFixed(1));
      const text = this.weight > 0 ? `${formatNumber(raw)} (smoothed ${formatNumber(drawn)})` : formatNumber(raw);
      parts.push(" · ", h("span", {"data-readout-series": spec.key, "data-value": String(raw)}, `${spec.label} ${text}`));
    });
    this.readout.replaceChildren(...parts);
    this.readout.dataset.step = String(step);
  }

  render() {
    const all = this.series.flatMap((spec) => spec.points);
    this.empty.classList.toggle("hidden", all.length > 0);
    const xs = all.map(([x]) => x);
    const ys = all.map(([, y]) => y);
    let [xLow, xHigh] = all.length ? [Math.min(...xs), Math.max(...xs)] : [0, 1];
    if (xLow === xHigh) xHigh = xLow + 1;
    const yTicks = niceTicks(all.length ? Math.min(...ys) : 0, all.length ? Math.max(...ys) : 1);
    const yLow = yTicks[0];
    const yHigh = yTicks[yTicks.length - 1];
    const px = (x) => PAD.left + ((x - xLow) / (xHigh - xLow)) * PLOT_W;
    const py = (y) => PAD.top + (1 - (y - yLow) / (yHigh - yLow || 1)) * PLOT_H;
    const toX = (viewX) => xLow + ((viewX - PAD.left) / PLOT_W) * (xHigh - xLow);
    this.scale = all.length ? {px, py, toX} : null;

    const grid = yTicks.map((tick) => [
      s("line", {x1: PAD.left, x2: WIDTH - PAD.right, y1: py(tick), y2: py(tick), class: "gridline"}),
      s("text", {x: PAD.left - 6, y: py(tick) + 4, "text-anchor": "end"}, formatNumber(tick, 3)),
    ]);
    const xTicks = niceTicks(xLow, xHigh, 5).filter((tick) => tick >= xLow && tick <= xHigh && Number.isInteger(tick));
    const xLabels = xTicks.map((tick) => s("text", {x: px(tick), y: HEIGHT - 10, "text-anchor": "middle"}, String(tick)));
    this.axes.replaceChildren(
      ...grid.flat(), ...xLabels,
      s("line", {x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: HEIGHT - PAD.bottom, class: "axis"}),
      s("line", {x1: PAD.left, x2: WIDTH - PAD.right, y1: HEIGHT - PAD.bottom, y2: HEIGHT - PAD.bottom, class: "axis"}),
      s("text", {x: PAD.left - 6, y: HEIGHT - 10, "text-anchor": "end", class: "axis-title"}, "step"));

    const drawPoints = (points) => points.map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(" ");
    this.svg.classList.toggle("smoothing", this.weight > 0);
    this.series.forEach((spec, index) => {
      const line = this.lines[index];
      const points = drawPoints(spec.points);
      if (line.getAttribute("points") !== points) line.setAttribute("points", points);
      line.setAttribute("data-points", String(spec.points.length));
      const smoothPoints = this.weight > 0 ? smoothed(spec.points, this.weight) : [];
      this.smoothLines[index].setAttribute("points", drawPoints(smoothPoints));
      const last = (this.weight > 0 ? smoothPoints : spec.points)[spec.points.length - 1];
      this.markers[index].setAttribute("cx", last ? px(last[0]).toFixed(1) : -10);
      this.markers[index].setAttribute("cy", last ? py(last[1]).toFixed(1) : -10);
    });
    this.desc.textContent = this.series.map((spec) => {
      const last = spec.points[spec.points.length - 1];
      if (!last) return `${spec.label}: no points yet.`;
      return `${spec.label}: ${spec.points.length} points, latest ${formatNumber(last[1])} at step ${last[0]}.`;
    }).join(" ");
    if (this.hoverStep !== null) this.hover(this.hoverStep);
  }
}

/**
 * The smoothing control of a group of charts: a slider from 0 (raw) to 0.99. `onChange` gets
 * the weight each time it moves.
 */
export function smoothingControl(onChange) {
  const slider = h("input", {type: "range", min: "0", max: "0.99", step: "0.01", value: "0",
    "data-testid": "chart-smoothing"});
  const shown = h("output", {class: "mono", "data-testid": "chart-smoothing-value"}, "0 (raw)");
  const id = uid("smooth");
  slider.id = id;
  shown.setAttribute("for", id);
  slider.addEventListener("input", () => {
    const weight = Number(slider.value);
    shown.textContent = weight > 0 ? weight.toFixed(2) : "0 (raw)";
    onChange(weight);
  });
  return h("div", {class: "chart-tools"},
    h("label", {for: id}, "Smoothing"), slider, shown,
    h("small", {class: "help"}, "Exponential moving average of each line; the raw values stay, faint."));
}
