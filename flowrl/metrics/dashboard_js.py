"""The dashboard's browser-side code (``CustomJS`` callbacks and the tick formatter), kept
apart from the Bokeh models of :mod:`flowrl.metrics.dashboard` that use it."""

# Copies the chosen step's rows of each "all" source into its "shown" source, orders the Gantt's
# rows by start time and retitles it. Runs in the browser: on a step change, and when the server
# pushes new rows.
PICK_STEP_JS = """
const step = Number(select.value);
// several runs on the page: the chosen run's rows only (its "run" column holds its label)
const run = run_select.visible ? run_select.value : null;
function rows_of(all, want_step) {
  const s = all.get_column("step") || [];
  const r = all.get_column("run") || [];
  const idx = [];
  for (let i = 0; i < s.length; i++) {
    if ((want_step === null || Number(s[i]) === want_step) && (run === null || r[i] === run)) idx.push(i);
  }
  return idx;
}
function pick(all, shown) {
  const idx = rows_of(all, step);
  const out = {};
  for (const k of all.columns()) { const c = all.get_column(k); out[k] = idx.map((i) => c[i]); }
  shown.data = out;
  return idx.length;
}
// the timeline: the step's rows, then rows of later steps that ran meanwhile (the generations
// ahead of a staleness run), moved onto this step's clock through each row's "origin" (its
// step's submission time) and named "<node> (step N)", drawn fainter
// (flowrl.metrics.timeline.overlapping_rows in Python)
function pick_timeline() {
  const cols = tl_all.columns();
  const col = (k) => tl_all.get_column(k);
  const own = rows_of(tl_all, step);
  const out = {};
  for (const k of cols) out[k] = own.map((i) => col(k)[i]);
  const origin = own.map((i) => Number(col("origin")[i])).find((o) => Number.isFinite(o));
  if (own.length && origin !== undefined) {
    const lo = Math.min(...out.start), hi = Math.max(...out.end);
    const extra = [];
    for (const i of rows_of(tl_all, null)) {
      const o = Number(col("origin")[i]);
      if (Number(col("step")[i]) <= step || !Number.isFinite(o)) continue;
      const a = col("start")[i] + o - origin, b = col("end")[i] + o - origin;
      if (b > lo + 1e-3 && a < hi - 1e-3) extra.push([a, b, i]);  // timeline.OVERLAP_MIN_S
    }
    extra.sort((x, y) => x[0] - y[0]);
    for (const [a, b, i] of extra) {
      for (const k of cols) out[k].push(col(k)[i]);
      const n = out.node.length - 1;
      out.node[n] = `${col("node")[i]} (step ${col("step")[i]})`;
      out.start[n] = a; out.end[n] = b; out.alpha[n] = 0.45;
    }
  }
  tl_shown.data = out;
  return own.length;
}
const n_nodes = pick_timeline();
const n_rows = pick(smp_all, smp_shown);
const nodes = tl_shown.data.node || [];
const order = [...new Set(nodes)];
y_range.factors = order.length ? order.slice().reverse() : ["(none)"];
gantt_title.text = n_nodes ? `step ${step}: graph nodes, seconds since the step was submitted`
                           : `step ${step}: no timeline rows`;
// a DataTable redraws when its view's indices change, which they do not when the new step has
// as many rows as the old one: tell it
table.view.change.emit();
// the table keeps a step's first rows (flowrl dashboard --max-samples): say so when there are more
// (dashboard_step.samples_note in Python)
const total = n_rows ? Number(smp_shown.data.step_rows[0]) : 0;
table_note.text = !n_rows ? `step ${step}: no experience Parquet`
  : total > n_rows ? `step ${step}: the first ${n_rows} of ${total} samples (flowrl dashboard --max-samples N shows more)`
  : `step ${step}: ${n_rows} samples`;
"""

# Several runs on the page, the run selector changed (args: select, run_select, tl_all, smp_all):
# the step selector offers the chosen run's steps (runs of different lengths: no step without
# rows), keeping the chosen step when the run has it, else its last. PICK_STEP_JS then shows it.
RUN_STEPS_JS = """
const want = run_select.value;
const steps = new Set();
for (const all of [tl_all, smp_all]) {
  const s = all.get_column("step") || [];
  const r = all.get_column("run") || [];
  for (let i = 0; i < s.length; i++) if (r[i] === want) steps.add(Number(s[i]));
}
const options = [...steps].sort((a, b) => a - b).map(String);
select.options = options;
if (options.length && !options.includes(select.value)) select.value = options[options.length - 1];
"""

# The metric filter (args: filter, the TextInput; sections, [section, title, grid] per all-metrics
# section, section a Pane holding the title and the grid, a Pane whose tags hold its figures):
# shows the figures (named "metric:<key>") whose key contains the typed text and hides the others,
# and hides a section (its title too) when none of its figures is left. A figure leaving the grid
# (its view dropped) before its ``visible`` flips to false, and flipping to true before it joins
# the grid, costs nothing: in Bokeh a figure whose visibility flips while it has a view lays itself
# out and repaints at once, each repaint waiting for the browser to restyle the page (seconds for
# a few dozen figures). A grid that keeps its figures is not touched, and Panes are no Bokeh
# layouts: hiding one lays nothing out. Sections not attached yet (ATTACH_JS) are attached here
# with the figures the filter shows.
FILTER_JS = """
const text = (filter.value_input ?? filter.value ?? "").trim().toLowerCase();
const shows = (fig) => fig.name.slice(7).toLowerCase().includes(text);
for (const [section, title, grid] of sections) {
  const figs = grid.tags;
  if (!figs.length) continue;  // a deferred section the server has not built yet: LIVE_ATTACH_JS filters it
  const keep = figs.filter(shows);
  const any = keep.length > 0;
  if (!any && section.visible) section.visible = false;  // hidden first: the title's flip lays out nothing shown
  if (title.visible !== any) title.visible = any;
  const now = grid.elements;
  const same = now.length === keep.length && now.every((fig, i) => fig === keep[i]);
  for (const fig of keep) if (!fig.visible) fig.visible = true;  // not in the grid yet: no view
  if (!same) grid.elements = keep;  // drops the views of the figures leaving, builds the new ones
  for (const fig of figs) if (fig.visible && !keep.includes(fig)) fig.visible = false;  // out of the grid: no view
  if (grid.visible !== any) grid.visible = any;
  if (any && !section.visible) section.visible = true;
}
"""

# After the first paint (the document's "document_ready"; args: panes, each holding its figures
# in its tags): fills the empty panes (throughput, reshard, the all-metrics sections) with them,
# one pane per browser task in page order, so the page stays responsive and paints between them.
# A pane already filled (by the server, by the filter, or an earlier run of this) is left alone. Marks
# "flowrl:first-paint" and "flowrl:all-metrics" in the page's performance timeline (read by
# benchmarks/dashboard_render.py).
ATTACH_JS = """
performance.mark("flowrl:first-paint");
const todo = panes.filter((pane) => pane.elements.length === 0 && pane.tags.length > 0);
let i = 0;
function next() {
  if (i >= todo.length) { performance.mark("flowrl:all-metrics"); return; }
  const pane = todo[i++];
  // the figures the filter left visible (all of them, unless the filter was used meanwhile)
  if (pane.elements.length === 0) pane.elements = pane.tags.filter((fig) => fig.visible);
  setTimeout(next, 0);
}
setTimeout(next, 0);
"""

# A live server's page (the document's "document_ready"): the server builds the deferred panes'
# figures now (flowrl.metrics.dashboard.Dashboard.build_deferred), the mark says the page is drawn.
FIRST_PAINT_JS = """
performance.mark("flowrl:first-paint");
"""

# A live server's session filled a deferred pane's tags with its figures (cb_obj: the pane; args:
# filter_cb, the metric filter's CustomJS, and panes, every deferred pane). The server attached
# them too, filtered with the text it had last heard of: an all-metrics grid goes through the
# filter again (a no-op unless the text changed meanwhile), another pane is filled if it is still
# empty; marks "flowrl:all-metrics" once every deferred pane has its figures.
LIVE_ATTACH_JS = """
const done = () => {
  if (panes.every((p) => p.tags.length > 0) && !performance.getEntriesByName("flowrl:all-metrics").length)
    performance.mark("flowrl:all-metrics");
};
if (cb_obj.name === "grid:metric") {
  filter_cb.execute(filter_cb).then(done);
} else {
  if (cb_obj.elements.length === 0) cb_obj.elements = cb_obj.tags.filter((fig) => fig.visible);
  done();
}
"""

# Shows the clicked sample row's whole prompt and its response as a conversation: each turn of
# the response (the "turns" column: JSON [[kind, text], ...], kind 1 the model's tokens, 0 a tool's
# answer) in its own block, tool turns marked and shaded.
SHOW_SAMPLE_JS = """
const i = src.selected.indices[0];
if (i === undefined) return;
const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const d = src.data;
let turns = [];
try { turns = JSON.parse(d.turns[i] || "[]"); } catch (e) { turns = []; }
if (!turns.length) turns = [[1, d.response[i]]];
let model = 0, tool = 0;
const blocks = turns.map(([kind, text]) => {
  const who = kind ? `model, turn ${++model}` : `tool answer ${++tool}`;
  const style = kind ? "border-left:3px solid #1f77b4;background:#f4f8fc"
                     : "border-left:3px solid #ff7f0e;background:#fff4e6";
  return `<div class="turn ${kind ? "model-turn" : "tool-turn"}" style="${style};margin:3px 0;padding:2px 6px">` +
         `<small><b>${who}</b></small><pre style="white-space:pre-wrap;margin:0">${esc(text)}</pre></div>`;
});
div.text = `<b>${esc(d.uid[i])}</b> score ${d.score[i]} (truth ${esc(d.ground_truth[i])}) &middot; ` +
  `${d.num_turns[i]} model turn(s), ${d.tool_calls[i]} tool call(s)` +
  `<div class="turn prompt-turn" style="border-left:3px solid #7f7f7f;margin:3px 0;padding:2px 6px">` +
  `<small><b>prompt</b></small>${(d.images && d.images[i]) ? `<div class="prompt-images">${d.images[i]}</div>` : ""}` +
  `<pre style="white-space:pre-wrap;margin:0">${esc(d.prompt[i])}</pre></div>` + blocks.join("");
"""

# Tick labels with as many significant digits as the tick spacing needs (not Bokeh's fixed
# precision: 1.0383370e+6), SI suffixes for large numbers, exponents for small ones.
TICK_JS = """
// a figure in log mode plots log10 of its values: label the tick with the value itself
if (typeof fig !== "undefined" && fig.tags.includes("log")) {
  const v = Math.pow(10, tick);
  if (Math.abs(tick - Math.round(tick)) < 1e-9) return Math.round(tick) === 0 ? "1" : "1e" + Math.round(tick);
  return v >= 1e4 || v < 1e-2 ? v.toExponential(1) : String(Number(v.toPrecision(2)));
}
const finite = ticks.filter((t) => Number.isFinite(t));
const step = finite.length > 1 ? Math.abs(finite[1] - finite[0]) : Math.abs(tick) || 1;
const big = Math.max(...finite.map((t) => Math.abs(t)), 0);
if (tick === 0) return "0";
if (big >= 1e4) {
  const [scale, suffix] = big >= 1e9 ? [1e9, "G"] : big >= 1e6 ? [1e6, "M"] : [1e3, "k"];
  const decimals = Math.max(0, Math.min(6, -Math.floor(Math.log10(step / scale) + 1e-9)));
  return (tick / scale).toFixed(decimals) + suffix;
}
if (big < 1e-2) {
  const digits = Math.max(0, Math.min(6, Math.ceil(Math.log10(big / step) - 1e-9)));
  return tick.toExponential(digits);
}
return tick.toFixed(Math.max(0, Math.min(8, -Math.floor(Math.log10(step) + 1e-9))));
"""

# The y values a metric line plots (a CustomJSTransform's v_func; args: fig, smoothing): the
# debiased exponential moving average of TensorBoard (weight = the slider's value; no slider:
# none), over the finite values, NaN kept where a step lacks the value; then log10 when the
# figure is in log mode (values <= 0 left out). flowrl.metrics.dashboard_figures.ema is the same
# smoothing in Python.
EMA_JS = """
const w = smoothing ? Math.min(Math.max(Number(smoothing.value), 0), 0.999) : 0;
const log = fig.tags.includes("log");
const out = new Float64Array(xs.length);
let last = 0, n = 0;
for (let i = 0; i < xs.length; i++) {
  let v = Number(xs[i]);
  if (!Number.isFinite(v)) { out[i] = NaN; continue; }
  if (w > 0) { n++; last = last * w + (1 - w) * v; v = last / (1 - Math.pow(w, n)); }
  out[i] = log ? (v > 0 ? Math.log10(v) : NaN) : v;
}
return out;
"""

# The smoothing slider moved: every run's lines recompute their transforms.
SMOOTHING_JS = """
for (const s of sources) s.change.emit();
"""

# A figure's log-scale toggle (a toolbar button): flips the figure's "log" tag, which its
# transforms and tick labels read, retitles it and redraws.
LOG_TOGGLE_JS = """
const on = !fig.tags.includes("log");
fig.tags = on ? [...fig.tags, "log"] : fig.tags.filter((t) => t !== "log");
fig.title.text = on ? `${title} (log)` : title;
for (const s of sources) s.change.emit();
"""
