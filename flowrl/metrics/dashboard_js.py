"""The dashboard's browser-side code (``CustomJS`` callbacks and the tick formatter), kept
apart from the Bokeh models of :mod:`flowrl.metrics.dashboard` that use it."""

# Copies the chosen step's rows of each "all" source into its "shown" source, orders the Gantt's
# rows by start time and retitles it. Runs in the browser: on a step change, and when the server
# pushes new rows.
PICK_STEP_JS = """
const step = Number(select.value);
function pick(all, shown) {
  const s = all.get_column("step") || [];
  const idx = [];
  for (let i = 0; i < s.length; i++) { if (Number(s[i]) === step) idx.push(i); }
  const out = {};
  for (const k of all.columns()) { const c = all.get_column(k); out[k] = idx.map((i) => c[i]); }
  shown.data = out;
  return idx.length;
}
const n_nodes = pick(tl_all, tl_shown);
const n_rows = pick(smp_all, smp_shown);
const nodes = tl_shown.data.node || [];
const order = [...new Set(nodes)];
y_range.factors = order.length ? order.slice().reverse() : ["(none)"];
gantt_title.text = n_nodes ? `step ${step}: graph nodes, seconds since the step was submitted`
                           : `step ${step}: no timeline rows`;
// a DataTable redraws when its view's indices change, which they do not when the new step has
// as many rows as the old one: tell it
table.view.change.emit();
table_note.text = n_rows ? `step ${step}: ${n_rows} samples` : `step ${step}: no experience Parquet`;
"""

# The metric filter: hides the all-metrics figures (named "metric:<key>") whose key does not
# contain the typed text, and the section titles left with nothing shown.
FILTER_JS = """
const text = (cb_obj.value_input || "").trim().toLowerCase();
for (const child of panel.children) {
  const figs = child.children || [];
  for (const fig of figs) {
    if (fig.name && fig.name.startsWith("metric:")) fig.visible = fig.name.slice(7).toLowerCase().includes(text);
  }
}
const kids = panel.children;
for (let i = 0; i + 1 < kids.length; i += 2) {
  const figs = kids[i + 1].children || [];
  kids[i].visible = kids[i + 1].visible = figs.some((f) => f.visible);
}
"""

# Shows the clicked sample row's whole prompt and response.
SHOW_SAMPLE_JS = """
const i = src.selected.indices[0];
if (i === undefined) return;
const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const d = src.data;
div.text = `<b>${esc(d.uid[i])}</b> score ${d.score[i]} (truth ${esc(d.ground_truth[i])})` +
  `<pre style="white-space:pre-wrap">PROMPT: ${esc(d.prompt[i])}\\nRESPONSE: ${esc(d.response[i])}</pre>`;
"""

# Tick labels with as many significant digits as the tick spacing needs (not Bokeh's fixed
# precision: 1.0383370e+6), SI suffixes for large numbers, exponents for small ones.
TICK_JS = """
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
