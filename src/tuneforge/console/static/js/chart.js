// A small SVG line chart for per-step metrics. Points are appended as they arrive and the
// chart is redrawn in place: each series is one <polyline> whose `points` attribute grows,
// so a screen reader's summary (the <desc>) and the drawing always agree.

import {h, s, uid, formatNumber} from "./dom.js";

const WIDTH = 480;
const HEIGHT = 200;
const PAD = {left: 52, right: 18, top: 10, bottom: 28};

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

function lineOf(spec) {
  return s("polyline", {class: `series series-${spec.index}${spec.dashed ? " dashed" : ""}`, "data-series": spec.key,
    "data-points": "0", points: "", fill: "none"});
}

function markerOf(spec) {
  return s("circle", {class: `marker series-${spec.index}`, r: 3, cx: -10, cy: -10});
}

function legendOf(spec) {
  return h("li", null, h("span", {class: `swatch series-${spec.index}${spec.dashed ? " dashed" : ""}`}), spec.label);
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
    this.series = series.map((spec, index) => ({...spec, index, points: []}));
    const captionId = uid("chart");
    this.desc = s("desc", {id: uid("desc")});
    this.axes = s("g", {class: "axes"});
    this.lines = this.series.map(lineOf);
    this.markers = this.series.map(markerOf);
    this.empty = s("text", {x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle", class: "empty"}, "No points yet");
    this.svg = s("svg", {viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-labelledby": captionId,
      "aria-describedby": this.desc.id, class: "chart-svg"}, this.desc, this.axes, this.lines, this.markers, this.empty);
    this.legend = h("ul", {class: "legend", "aria-hidden": "true"}, this.series.map(legendOf));
    this.element = h("figure", {class: "chart", "data-chart": name},
      h("figcaption", {id: captionId}, title), this.svg, this.legend);
    this.render();
  }

  /** Another series, e.g. the validation figure of a method's own training figure, once it appears. */
  addSeries({key, label, dashed = false}) {
    if (this.series.some((candidate) => candidate.key === key)) return;
    const spec = {key, label, dashed, index: this.series.length, points: []};
    this.series.push(spec);
    this.lines.push(lineOf(spec));
    this.markers.push(markerOf(spec));
    this.svg.insertBefore(this.lines[this.lines.length - 1], this.markers[0]);
    this.svg.insertBefore(this.markers[this.markers.length - 1], this.empty);
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
    const plotW = WIDTH - PAD.left - PAD.right;
    const plotH = HEIGHT - PAD.top - PAD.bottom;
    const px = (x) => PAD.left + ((x - xLow) / (xHigh - xLow)) * plotW;
    const py = (y) => PAD.top + (1 - (y - yLow) / (yHigh - yLow || 1)) * plotH;

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

    this.series.forEach((spec, index) => {
      const line = this.lines[index];
      const points = spec.points.map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(" ");
      if (line.getAttribute("points") !== points) line.setAttribute("points", points);
      line.setAttribute("data-points", String(spec.points.length));
      const last = spec.points[spec.points.length - 1];
      this.markers[index].setAttribute("cx", last ? px(last[0]).toFixed(1) : -10);
      this.markers[index].setAttribute("cy", last ? py(last[1]).toFixed(1) : -10);
    });
    this.desc.textContent = this.series.map((spec) => {
      const last = spec.points[spec.points.length - 1];
      if (!last) return `${spec.label}: no points yet.`;
      return `${spec.label}: ${spec.points.length} points, latest ${formatNumber(last[1])} at step ${last[0]}.`;
    }).join(" ");
  }
}
