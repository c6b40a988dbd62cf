// The live plot of notebook_kit, drawn in the browser on a canvas per panel.
// The kernel sends only new points ({points: {name: [[x...], [y...]]}}, a custom message);
// `snapshot` holds every point for views opened later and for the saved widget state.
// Smoothing and the axes come from the controls' model (`controls`, plot_controls.js).

const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const Y_SCALES = ["auto", "linear", "log"];  // plot_widget.Y_SCALES
const MARGIN = { left: 58, right: 10, top: 8, bottom: 34 };
const FLAT_SPAN = 1e-9;  // panels._FLAT_SPAN
const FONT = "11px system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif";

function lowerBound(xs, x) {
  let lo = 0, hi = xs.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid + 1; else hi = mid; }
  return lo;
}

// Points arrive in step order almost always: append; a repeated step replaces its mean.
function merge(series, xs, ys) {
  for (let i = 0; i < xs.length; i++) {
    const x = xs[i], n = series.x.length;
    if (n === 0 || x > series.x[n - 1]) { series.x.push(x); series.y.push(ys[i]); continue; }
    const at = lowerBound(series.x, x);
    if (series.x[at] === x) series.y[at] = ys[i];
    else { series.x.splice(at, 0, x); series.y.splice(at, 0, ys[i]); }
  }
}

function ema(ys, weight) {
  if (weight <= 0) return ys;
  const out = new Array(ys.length);
  let last = 0, count = 0;
  for (let i = 0; i < ys.length; i++) {
    const v = ys[i];
    if (!Number.isFinite(v)) { out[i] = v; continue; }
    count += 1;
    last = last * weight + (1 - weight) * v;
    out[i] = last / (1 - Math.pow(weight, count));
  }
  return out;
}

// Same rule as panels.axis_limits: a margin, and a readable range for one point or a flat line
// (values equal but for rounding, as a constant learning rate often is).
function limits(values, log) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) {
    if (!Number.isFinite(v) || (log && v <= 0)) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  if (lo === Infinity) return null;
  if (hi - lo <= FLAT_SPAN * Math.max(Math.abs(lo), Math.abs(hi))) lo = hi;
  if (log) { lo = Math.log10(lo); hi = Math.log10(hi); }
  let pad = (hi - lo) * 0.05;
  if (hi === lo) pad = log ? 0.5 : (lo ? Math.abs(lo) * 0.1 : 1);
  return [lo - pad, hi + pad];
}

// "auto": logarithmic when every value is positive and they span more than a thousandfold.
function useLog(values, scale) {
  if (scale !== "auto") return scale === "log";
  let lo = Infinity, hi = -Infinity;
  for (const v of values) {
    if (!Number.isFinite(v)) continue;
    if (v <= 0) return false;
    lo = Math.min(lo, v); hi = Math.max(hi, v);
  }
  return lo !== Infinity && hi > 1000 * lo;
}

function niceTicks(lo, hi, count, whole = false) {
  const raw = Math.max((hi - lo) / Math.max(count, 1), whole ? 1 : 0);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  const step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
  return { ticks, step };
}

function label(value, step) {
  if (value === 0) return "0";
  const size = Math.abs(value);
  if (size >= 1e5 || size < 1e-3) return value.toExponential(1).replace("e+", "e");
  const decimals = Math.max(0, Math.min(8, -Math.floor(Math.log10(step) + 1e-9)));
  return value.toFixed(decimals);
}

// Where a step falls along the logged epoch (panels.epoch_positions): interpolated between
// two logged steps, the first or last epoch outside them.
function epochAt(epochs, step) {
  const n = epochs.x.length, i = lowerBound(epochs.x, step);
  if (i >= n) return epochs.y[n - 1];
  if (epochs.x[i] === step || i === 0) return epochs.y[i];
  const s0 = epochs.x[i - 1], s1 = epochs.x[i], e0 = epochs.y[i - 1], e1 = epochs.y[i];
  return e0 + ((e1 - e0) * (step - s0)) / (s1 - s0);
}

function format(value) {
  const size = Math.abs(value);
  if (size !== 0 && (size >= 1e5 || size < 1e-3)) return value.toExponential(3);
  return String(Number(value.toPrecision(4)));
}

function render({ model, el }) {
  const data = {};  // name -> {x: [], y: []}
  const root = document.createElement("div");
  root.className = "nk-plot-area";
  el.appendChild(root);
  let canvases = [], pointer = null, pending = false, controls = null, gone = false;
  const setting = (name, fallback) => (controls ? controls.get(name) : fallback);

  const load = (snapshot) => {
    for (const name of Object.keys(data)) delete data[name];
    for (const [name, [xs, ys]] of Object.entries(snapshot || {})) {
      data[name] = { x: [], y: [] };
      merge(data[name], xs, ys);
    }
  };
  const schedule = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
  };

  function layout() {
    const spec = model.get("spec") || {};
    const panels = spec.panels || [];
    root.style.height = `${spec.height || 260}px`;
    root.replaceChildren();
    canvases = [];
    const columns = Math.max(1, Math.min(panels.length, 3));
    const rows = Math.max(1, Math.ceil(panels.length / columns));
    for (let i = 0; i < Math.max(panels.length, 1); i++) {
      const canvas = document.createElement("canvas");
      canvas.className = "nk-plot-panel";
      canvas.style.width = `${100 / columns}%`;
      canvas.style.height = `${100 / rows}%`;
      canvas.addEventListener("mousemove", (e) => { pointer = { i, x: e.offsetX }; schedule(); });
      canvas.addEventListener("mouseleave", () => { pointer = null; schedule(); });
      root.appendChild(canvas);
      canvases.push(canvas);
    }
  }

  function draw() {
    const spec = model.get("spec") || {};
    const panels = spec.panels || [];
    const evals = new Set(spec.eval || []);
    const names = panels.flatMap((p) => p.names);
    const colour = (name) => COLOURS[names.indexOf(name) % COLOURS.length];
    const epochs = spec.x_metric && data[spec.x_metric];
    const byEpoch = setting("x_axis", "step") === "epoch" && epochs && epochs.x.length > 0;
    const options = { scale: Y_SCALES[setting("y_scale", 0)] || "auto",
      smoothing: Number(setting("smoothing", 0)) || 0, evals, colour, whole: !byEpoch,
      marks: byEpoch ? [] : spec.marks || [] };
    // Drawn against the logged epoch: each series with its steps moved to their epochs.
    const along = byEpoch
      ? (name) => ({ x: data[name].x.map((step) => epochAt(epochs, step)), y: data[name].y })
      : (name) => data[name];
    let newest = -Infinity;
    for (const series of Object.values(data)) {
      if (series.x.length) newest = Math.max(newest, series.x[series.x.length - 1]);
    }
    if (!panels.length) drawEmpty(canvases[0], spec.waiting || "");
    const xLabel = byEpoch ? "epoch" : spec.x_label || "step";
    panels.forEach((panel, i) => drawPanel(canvases[i], panel, xLabel, options, along,
      pointer && pointer.i === i ? pointer.x : null));
    el.dataset.xAxis = xLabel;
    el.dataset.marks = String((spec.marks || []).length);
    // The newest step drawn, on the element: what tests and benchmarks watch.
    if (newest > -Infinity) el.dataset.lastX = String(newest);
  }

  function prepare(canvas) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth, height = canvas.clientHeight;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = FONT;
    return { ctx, width, height };
  }

  function drawEmpty(canvas, text) {
    if (!canvas) return;
    const { ctx, width, height } = prepare(canvas);
    ctx.fillStyle = "#888";
    ctx.textAlign = "center";
    ctx.fillText(text, width / 2, height / 2);
  }

  function drawPanel(canvas, panel, xLabel, options, along, hoverX) {
    const { ctx, width, height } = prepare(canvas);
    const box = { x: MARGIN.left, y: MARGIN.top, w: width - MARGIN.left - MARGIN.right,
      h: height - MARGIN.top - MARGIN.bottom };
    if (box.w < 20 || box.h < 20) return;
    const shown = panel.names.filter((n) => data[n] && data[n].x.length);
    const series = Object.fromEntries(shown.map((name) => [name, along(name)]));
    const xs = [], ys = [];
    for (const name of shown) {
      const s = series[name];
      xs.push(s.x[0], s.x[s.x.length - 1]);
      for (const y of s.y) ys.push(y);
    }
    options = { ...options, log: useLog(ys, options.scale) };
    const xr = limits(xs, false), yr = limits(ys, options.log);
    if (!xr || !yr) { drawEmpty(canvas, ""); return; }
    if (xs.every((x) => x === xs[0])) { xr[0] = xs[0] - 1; xr[1] = xs[0] + 1; }
    else { xr[0] = Math.min(...xs); xr[1] = Math.max(...xs); }
    const px = (x) => box.x + ((x - xr[0]) / (xr[1] - xr[0])) * box.w;
    const py = (y) => {
      const t = options.log ? Math.log10(y) : y;
      return box.y + box.h - ((t - yr[0]) / (yr[1] - yr[0])) * box.h;
    };
    axes(ctx, box, xr, yr, options.log, xLabel, panel.label, options.whole);
    ctx.save();
    ctx.beginPath();
    ctx.rect(box.x, box.y, box.w, box.h);
    ctx.clip();
    restartMarks(ctx, box, xr, px, options.marks);
    for (const name of shown) {
      const s = series[name], isEval = options.evals.has(name) || s.x.length < 2;
      const smooth = !isEval && options.smoothing > 0;
      ctx.strokeStyle = ctx.fillStyle = options.colour(name);
      if (smooth) {
        ctx.globalAlpha = 0.25;
        line(ctx, s.x, s.y, px, py, options.log, box.w);
        ctx.globalAlpha = 1;
        line(ctx, s.x, ema(s.y, options.smoothing), px, py, options.log, box.w);
      } else {
        line(ctx, s.x, s.y, px, py, options.log, box.w, isEval ? 1 : 1.5);
      }
      if (isEval) markers(ctx, s.x, s.y, px, py, options.log);
    }
    ctx.restore();
    legend(ctx, box, shown, options, panel);
    if (hoverX !== null && hoverX >= box.x && hoverX <= box.x + box.w) {
      readout(ctx, box, shown, series, xr, hoverX, px, xLabel, panel);
    }
  }

  // Where each restart resumed: a dashed line and its label ("restart 1 · 2 ranks").
  function restartMarks(ctx, box, xr, px, marks) {
    ctx.save();
    ctx.setLineDash([4, 3]);
    ctx.strokeStyle = "#777";
    ctx.fillStyle = "#555";
    ctx.lineWidth = 1;
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    for (const [step, text] of marks) {
      if (step < xr[0] || step > xr[1]) continue;
      const x = px(step);
      ctx.beginPath(); ctx.moveTo(x, box.y); ctx.lineTo(x, box.y + box.h); ctx.stroke();
      ctx.fillText(text, x + 3, box.y + 2);
    }
    ctx.restore();
  }

  function axes(ctx, box, xr, yr, log, xLabel, yLabel, whole) {
    ctx.strokeStyle = "#e5e5e5";
    ctx.fillStyle = "#444";
    ctx.lineWidth = 1;
    const xt = niceTicks(xr[0], xr[1], Math.max(2, Math.floor(box.w / 80)), whole);
    const yt = niceTicks(yr[0], yr[1], Math.max(2, Math.floor(box.h / 40)));
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (const t of xt.ticks) {
      const x = box.x + ((t - xr[0]) / (xr[1] - xr[0])) * box.w;
      ctx.beginPath(); ctx.moveTo(x, box.y); ctx.lineTo(x, box.y + box.h); ctx.stroke();
      ctx.fillText(label(t, xt.step), x, box.y + box.h + 4);
    }
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const t of yt.ticks) {
      const y = box.y + box.h - ((t - yr[0]) / (yr[1] - yr[0])) * box.h;
      ctx.beginPath(); ctx.moveTo(box.x, y); ctx.lineTo(box.x + box.w, y); ctx.stroke();
      const text = log ? format(Math.pow(10, t)) : label(t, yt.step);
      ctx.fillText(text, box.x - 4, y);
    }
    ctx.strokeStyle = "#999";
    ctx.strokeRect(box.x, box.y, box.w, box.h);
    ctx.textAlign = "center";
    ctx.textBaseline = "bottom";
    ctx.fillText(xLabel, box.x + box.w / 2, box.y + box.h + MARGIN.bottom);
    ctx.save();
    ctx.translate(12, box.y + box.h / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.textBaseline = "middle";
    ctx.fillText(log ? `${yLabel} (log)` : yLabel, 0, 0);
    ctx.restore();
  }

  // Long series: one vertical min-max segment per pixel column keeps the shape and the cost flat.
  function line(ctx, xs, ys, px, py, log, width, lineWidth = 1.5) {
    ctx.lineWidth = lineWidth;
    ctx.beginPath();
    let started = false, column = null, low = 0, high = 0;
    const flush = () => {
      if (column === null) return;
      if (!started) { ctx.moveTo(column, low); started = true; } else ctx.lineTo(column, low);
      if (high !== low) ctx.lineTo(column, high);
    };
    const dense = xs.length > 2 * width;
    for (let i = 0; i < xs.length; i++) {
      const y = ys[i];
      if (!Number.isFinite(y) || (log && y <= 0)) continue;
      const x = px(xs[i]), yy = py(y);
      if (!dense) {
        if (!started) { ctx.moveTo(x, yy); started = true; } else ctx.lineTo(x, yy);
        continue;
      }
      const c = Math.round(x);
      if (c !== column) { flush(); column = c; low = high = yy; }
      else { low = Math.min(low, yy); high = Math.max(high, yy); }
    }
    flush();
    ctx.stroke();
  }

  function markers(ctx, xs, ys, px, py, log) {
    for (let i = 0; i < xs.length; i++) {
      if (!Number.isFinite(ys[i]) || (log && ys[i] <= 0)) continue;
      ctx.beginPath();
      ctx.arc(px(xs[i]), py(ys[i]), 3.5, 0, 2 * Math.PI);
      ctx.fill();
    }
  }

  // The kernel caps a panel's lines (panel.more counts the others) and shortens long names.
  function legend(ctx, box, names, options, panel) {
    if (!names.length) return;
    const text = (name) => (panel.short && panel.short[name]) || name;
    const more = panel.more ? `+${panel.more.toLocaleString("en-US")} more` : null;
    const rows = more ? names.length + 1 : names.length;
    const widths = names.map((n) => ctx.measureText(text(n)).width);
    if (more) widths.push(ctx.measureText(more).width);
    const w = Math.max(...widths) + 34, h = rows * 16 + 6;
    const x = box.x + box.w - w - 6, y = box.y + 6;
    ctx.fillStyle = "rgba(255,255,255,0.85)";
    ctx.strokeStyle = "#ccc";
    ctx.fillRect(x, y, w, h);
    ctx.strokeRect(x, y, w, h);
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    names.forEach((name, i) => {
      const cy = y + 11 + i * 16;
      ctx.strokeStyle = ctx.fillStyle = options.colour(name);
      ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(x + 6, cy); ctx.lineTo(x + 24, cy); ctx.stroke();
      if (options.evals.has(name)) { ctx.beginPath(); ctx.arc(x + 15, cy, 3.5, 0, 2 * Math.PI); ctx.fill(); }
      ctx.fillStyle = "#333";
      ctx.fillText(text(name), x + 30, cy);
    });
    if (more) { ctx.fillStyle = "#666"; ctx.fillText(more, x + 30, y + 11 + names.length * 16); }
  }

  function readout(ctx, box, names, series, xr, hoverX, px, xLabel, panel) {
    const target = xr[0] + ((hoverX - box.x) / box.w) * (xr[1] - xr[0]);
    const parts = [];
    let at = null;
    for (const name of names) {
      const s = series[name];
      let i = Math.min(lowerBound(s.x, target), s.x.length - 1);
      if (i > 0 && Math.abs(s.x[i - 1] - target) < Math.abs(s.x[i] - target)) i -= 1;
      if (at === null) at = s.x[i];
      parts.push(`${(panel.short && panel.short[name]) || name} ${format(s.y[i])}`);
    }
    if (at === null) return;
    ctx.strokeStyle = "#888";
    ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(px(at), box.y); ctx.lineTo(px(at), box.y + box.h); ctx.stroke();
    const text = `${xLabel} ${format(at)} · ${parts.join(" · ")}`;
    const w = ctx.measureText(text).width + 10;
    const x = Math.min(Math.max(box.x, px(at) - w / 2), box.x + box.w - w);
    ctx.fillStyle = "rgba(255,255,255,0.92)";
    ctx.fillRect(x, box.y + box.h - 22, w, 18);
    ctx.fillStyle = "#222";
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    ctx.fillText(text, x + 5, box.y + box.h - 13);
  }

  const onMessage = (message) => {
    if (!message || !message.points) return;
    for (const [name, [xs, ys]] of Object.entries(message.points)) {
      if (!data[name]) data[name] = { x: [], y: [] };
      merge(data[name], xs, ys);
    }
    schedule();
  };
  const onSpec = () => { layout(); schedule(); };
  const onSnapshot = () => { load(model.get("snapshot")); schedule(); };
  const settings = ["change:smoothing", "change:y_scale", "change:x_axis"];
  load(model.get("snapshot"));
  layout();
  schedule();
  model.on("msg:custom", onMessage);
  model.on("change:spec", onSpec);
  model.on("change:snapshot", onSnapshot);
  const controlsId = String(model.get("controls") || "").replace(/^IPY_MODEL_/, "");
  if (controlsId && model.widget_manager) {
    Promise.resolve(model.widget_manager.get_model(controlsId)).then((found) => {
      if (gone || !found) return;
      controls = found;
      for (const event of settings) controls.on(event, schedule);
      schedule();
    }).catch(() => {});  // no controls (closed): drawn with the defaults
  }
  const resize = new ResizeObserver(schedule);
  resize.observe(root);
  return () => {
    gone = true;
    resize.disconnect();
    model.off("msg:custom", onMessage);
    model.off("change:spec", onSpec);
    model.off("change:snapshot", onSnapshot);
    if (controls) for (const event of settings) controls.off(event, schedule);
  };
}

export default { render };
