// The live plot's controls: smoothing, y axis and, once an epoch is logged, x axis.
// A widget of their own (plot.PlotControls): the plot reads their values in the
// browser, and the kernel serves their comm on a subshell while the cell runs, so it knows
// the user's choice for the final PNG. Whether an epoch is logged is in the plot's spec
// (`x_metric`): the kernel never publishes this widget once the run is under way.

const Y_SCALES = ["auto", "linear", "log"];  // plot_widget.Y_SCALES
const X_AXES = ["step", "epoch"];  // plot_widget.X_AXES

function field(text, input, title) {
  const label = document.createElement("label");
  if (title) label.title = title;
  label.append(text, input);
  return label;
}

function options(select, values) {
  const now = Array.from(select.options, (o) => o.value);
  if (now.join() === values.join()) return;
  select.replaceChildren(...values.map((v) => new Option(v, v)));
}

function render({ model, el }) {
  el.classList.add("nk-plot-controls");
  const slider = document.createElement("input");
  Object.assign(slider, { type: "range", min: "0", max: "0.99", step: "0.01" });
  slider.className = "nk-smoothing";
  const readout = document.createElement("span");
  readout.className = "nk-smoothing-value";
  const yAxis = document.createElement("select");
  yAxis.className = "nk-y-axis";
  options(yAxis, Y_SCALES);
  const xAxis = document.createElement("select");
  xAxis.className = "nk-x-axis";
  options(xAxis, X_AXES);
  const xField = field("x axis", xAxis, "the logged step, or the logged epoch");
  el.append(
    field("smoothing", slider, "TensorBoard's exponential moving average"),
    readout,
    field("y axis", yAxis, "auto: log once positive values span 1000×"),
    xField,
  );

  let plot = null, gone = false;
  const show = () => {
    const smoothing = Number(model.get("smoothing")) || 0;
    if (document.activeElement !== slider) slider.value = String(smoothing);
    readout.textContent = smoothing.toFixed(2);
    yAxis.selectedIndex = model.get("y_scale") || 0;
    xAxis.value = X_AXES.includes(model.get("x_axis")) ? model.get("x_axis") : "step";
    const spec = (plot && plot.get("spec")) || {};
    xField.style.display = spec.x_metric ? "" : "none";
  };
  // The plot redraws on every move (a change of this model in the browser); the kernel
  // hears of it when the slider is let go.
  slider.addEventListener("input", () => {
    model.set("smoothing", Number(slider.value));
    readout.textContent = Number(slider.value).toFixed(2);
  });
  slider.addEventListener("change", () => model.save_changes());
  yAxis.addEventListener("change", () => {
    model.set("y_scale", yAxis.selectedIndex);
    model.save_changes();
  });
  xAxis.addEventListener("change", () => {
    model.set("x_axis", xAxis.value);
    model.save_changes();
  });
  const events = ["change:smoothing", "change:y_scale", "change:x_axis"];
  for (const event of events) model.on(event, show);
  const plotId = String(model.get("plot") || "").replace(/^IPY_MODEL_/, "");
  if (plotId && model.widget_manager) {
    Promise.resolve(model.widget_manager.get_model(plotId)).then((found) => {
      if (gone || !found) return;
      plot = found;
      plot.on("change:spec", show);
      show();
    }).catch(() => {});  // no plot (closed): no x-axis switch
  }
  show();
  return () => {
    gone = true;
    for (const event of events) model.off(event, show);
    if (plot) plot.off("change:spec", show);
  };
}

export default { render };
