// ESP playground: one slider per subspace, results as the weights move.
// Plain browser JavaScript, no build step, no third-party code; it calls only this service's
// API, by URLs relative to the page (so it works behind a path prefix too).
"use strict";

(() => {
  const BASE = new URL(".", window.location.href);
  const DEBOUNCE_MS = 150;
  const TEXT_CHARS = 280;
  // Registry names (esp_retrieval/service/tuning/schema.py NAME_RE): what "save as operating point" accepts.
  const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
  const PLAIN_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;

  const $ = (sel, root = document) => root.querySelector(sel);
  const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const fmt = (x, digits = 3) => (Number.isFinite(x) ? x.toFixed(digits) : String(x));
  const fmtWeight = (x) => String(Math.round(x * 1e6) / 1e6);

  // ---------------------------------------------------------------- API
  class ApiError extends Error {
    constructor(status, body) {
      const message = body && typeof body.message === "string" ? body.message : `HTTP ${status}`;
      super(message);
      this.status = status;
      this.type = body && body.type ? body.type : "error";
      this.field = body && typeof body.field === "string" ? body.field : null;
    }
  }

  async function api(path, { body, signal } = {}) {
    const init = { method: body === undefined ? "GET" : "POST", signal, headers: {} };
    if (body !== undefined) {
      init.headers["content-type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(new URL(path, BASE), init);
    } catch (err) {
      if (err.name === "AbortError") throw err;
      throw new ApiError(0, { type: "network_error", message: `the service did not answer (${err.message})` });
    }
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }

  // ---------------------------------------------------------------- errors, inline by field
  // Elements with data-field="queries", "k", "weights.entity", ... receive the API errors whose
  // `field` they prefix; the rest go to the form's own error line.
  function fieldMatches(prefix, field) {
    if (!field.startsWith(prefix)) return false;
    const next = field.charAt(prefix.length);
    return next === "" || next === "." || next === "[";
  }

  function errorSlot(container) {
    let slot = $(":scope > .error", container);
    if (!slot) {
      slot = el("p", { class: "error", role: "alert", hidden: true });
      container.append(slot);
    }
    return slot;
  }

  // Clears the form's errors, except those inside another weight set than `scopeFieldset`.
  function clearErrors(form, scopeFieldset = null) {
    const mine = (node) => {
      const owner = node.closest("fieldset.weights");
      return !owner || !scopeFieldset || owner === scopeFieldset;
    };
    for (const slot of $$(".error", form).filter(mine)) {
      slot.hidden = true;
      slot.textContent = "";
    }
    for (const input of $$("[aria-invalid]", form).filter(mine)) input.removeAttribute("aria-invalid");
  }

  function describeError(err) {
    // The service's messages usually start with the field they name: say it once.
    const where = err.field && !err.message.startsWith(err.field) ? ` in ${err.field}` : "";
    const status = err.status ? `HTTP ${err.status} ${err.type}` : err.type;
    return `Error (${status})${where}: ${err.message}`;
  }

  // scopeFieldset: the weight set whose request failed (its weights.* fields are searched first).
  function showError(form, err, scopeFieldset = null) {
    let target = null;
    if (err.field) {
      const candidates = $$("[data-field]", form).filter((node) => {
        const owner = node.closest("fieldset.weights");
        return !owner || !scopeFieldset || owner === scopeFieldset;
      });
      let best = -1;
      for (const node of candidates) {
        const prefix = node.dataset.field;
        if (fieldMatches(prefix, err.field) && prefix.length > best) {
          best = prefix.length;
          target = node;
        }
      }
    }
    const slot = target ? errorSlot(target) : $(":scope > .form-error", form);
    slot.textContent = describeError(err);
    slot.hidden = false;
    if (target) {
      const input = $("input, textarea, select", target);
      if (input) input.setAttribute("aria-invalid", "true");
    }
    return slot;
  }

  // ---------------------------------------------------------------- served layout and registry
  const served = { layout: null, points: [], experiments: [], defaultPoint: null, version: "" };

  // Every weight a request may set: the subspaces, then the bundle's sparse blocks (BM25 over the
  // corpus vocabulary, scored from the query text; /v1/layout lists them under `sparse`).
  function weighable() {
    return [...served.layout.subspaces, ...(served.layout.sparse || []).map((s) => ({ ...s, sparse: true }))];
  }

  function presetOptions() {
    const options = [{ value: "defaults", label: "layout defaults", weights: served.layout.default_weights }];
    for (const p of served.points) {
      const desc = p.description ? ` — ${p.description}` : "";
      options.push({ value: `op:${p.name}`, label: `${p.name}${desc} (${p.source})`, weights: p.weights, group: "op" });
    }
    for (const e of served.experiments) {
      for (const arm of e.arms) {
        const point = served.points.find((p) => p.name === arm.operating_point);
        if (!point) continue;
        const share = Math.round(arm.share * 100);
        options.push({
          value: `arm:${e.name}/${arm.name}`,
          label: `${e.name} / ${arm.name} (${share}% of units) → ${arm.operating_point}`,
          weights: point.weights,
          group: "arm",
        });
      }
    }
    return options;
  }

  function yamlNumber(x) {
    // Registry rule: write 1.0e-3, not 1e-3 (YAML 1.1 reads the latter as a string).
    let text = String(Math.round(x * 1e9) / 1e9);
    if (/e/i.test(text)) {
      const [mantissa, exponent] = text.split(/e/i);
      text = `${mantissa.includes(".") ? mantissa : `${mantissa}.0`}e${exponent}`;
    } else if (!text.includes(".")) {
      text = `${text}.0`;
    }
    return text;
  }

  function registrySnippet(name, weights) {
    const key = (k) => (PLAIN_KEY.test(k) ? k : JSON.stringify(k));
    const pairs = weighable().map((s) => `${key(s.name)}: ${yamlNumber(weights[s.name])}`);
    const description = `saved from the playground (bundle ${served.version})`;
    return [
      "# Add under operating_points: in the registry file (ESP_REGISTRY); check it before it ships:",
      "#   python -m esp_retrieval.service.tuning check registry.yaml --bundle DIR",
      "operating_points:",
      `  ${name}:`,
      `    description: ${JSON.stringify(description)}`,
      `    weights: {${pairs.join(", ")}}`,
      "",
    ].join("\n");
  }

  // ---------------------------------------------------------------- a weight set: picker + sliders
  class WeightSet {
    constructor(id, title, onChange, { save = true } = {}) {
      this.id = id;
      this.onChange = onChange;
      this.weights = {};
      this.sliders = {};
      this.numbers = {};
      this.values = {};
      const names = weighable().map((s) => s.name);
      this.fieldset = el("fieldset", { class: "weights", id: id, dataset: { field: "weights" } },
        el("legend", { text: title }));
      this.picker = el("select", { id: `${id}-preset`, "aria-describedby": `${id}-preset-desc` });
      this.fieldset.append(
        el("div", { class: "field", dataset: { field: "operating_point" } },
          el("label", { for: this.picker.id, text: "Operating point or experiment arm (sets the sliders)" }),
          this.picker,
          el("p", { class: "hint", id: `${id}-preset-desc` })),
      );
      this.fillPicker();
      this.picker.addEventListener("change", () => this.pick(this.picker.value));
      for (const s of weighable()) this.fieldset.append(this.slider(s));
      if (save) this.fieldset.append(this.savePanel());
      this.set(served.layout.default_weights, false);
      if (names.length === 0) this.fieldset.append(el("p", { text: "the layout has no subspaces" }));
    }

    fillPicker() {
      const groups = { op: el("optgroup", { label: "Operating points" }), arm: el("optgroup", { label: "Experiment arms" }) };
      this.picker.replaceChildren(el("option", { value: "", text: "custom (the sliders below)" }));
      this.options = presetOptions();
      for (const o of this.options) {
        const option = el("option", { value: o.value, text: o.label });
        (o.group ? groups[o.group] : this.picker).append(option);
      }
      for (const group of Object.values(groups)) if (group.children.length) this.picker.append(group);
    }

    slider(sub) {
      const sliderId = `${this.id}-${sub.name}`;
      const range = el("input", {
        type: "range", id: sliderId, name: sub.name, min: 0, max: 2, step: 0.01,
        "aria-describedby": `${sliderId}-value`,
      });
      const number = el("input", {
        type: "number", id: `${sliderId}-number`, min: 0, step: 0.01, class: "weight-number",
        "aria-label": `${sub.name} weight, exact value`,
      });
      const value = el("output", { id: `${sliderId}-value`, for: sliderId });
      range.addEventListener("input", () => this.edit(sub.name, Number(range.value), "range"));
      number.addEventListener("input", () => {
        if (number.value.trim() === "" || !Number.isFinite(number.valueAsNumber)) return;
        this.edit(sub.name, number.valueAsNumber, "number");
      });
      this.sliders[sub.name] = range;
      this.numbers[sub.name] = number;
      this.values[sub.name] = value;
      return el("div", { class: "slider", dataset: { field: `weights.${sub.name}` } },
        el("label", { for: sliderId }, sub.name, el("span", { class: "hint", text: sub.sparse ? " (sparse BM25, text queries)" : ` (dim ${sub.dim})` })),
        range, number, value);
    }

    savePanel() {
      const nameInput = el("input", { type: "text", id: `${this.id}-save-name`, value: `${this.id}_point`, spellcheck: "false" });
      const out = el("pre", { id: `${this.id}-yaml`, class: "yaml", tabindex: 0, "aria-label": "registry YAML snippet" });
      const note = el("p", { class: "hint", id: `${this.id}-save-note` });
      const panel = el("div", { class: "save-panel", hidden: true },
        el("label", { for: nameInput.id, text: "Operating point name" }), nameInput, note, out);
      const button = el("button", { type: "button", class: "save", "aria-expanded": "false", "aria-controls": `${this.id}-save` },
        "Save as operating point…");
      panel.id = `${this.id}-save`;
      const render = () => {
        const name = nameInput.value.trim();
        const values = Object.values(this.weights);
        const problem = !NAME_RE.test(name)
          ? "Error: a name is 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit."
          : values.some((w) => !Number.isFinite(w) || w < 0) || !values.some((w) => w > 0)
            ? "Error: the registry takes weights that are finite, >= 0 and not all zero."
            : null;
        out.hidden = problem !== null;
        if (problem) {
          note.textContent = problem;
          out.textContent = "";
          return;
        }
        note.textContent = "The page never writes the registry: copy this into the file yourself.";
        out.textContent = registrySnippet(name, this.weights);
      };
      this.renderSnippet = () => { if (!panel.hidden) render(); };
      button.addEventListener("click", () => {
        panel.hidden = !panel.hidden;
        button.setAttribute("aria-expanded", String(!panel.hidden));
        render();
      });
      nameInput.addEventListener("input", render);
      return el("div", { class: "save-box" }, button, panel);
    }

    // Show `weights` (missing names: layout defaults) on the sliders; notify when `notify`.
    set(weights, notify = true) {
      for (const s of weighable()) {
        const w = Number(weights[s.name] ?? served.layout.default_weights[s.name]);
        this.weights[s.name] = w;
        this.show(s.name, null);
      }
      if (this.renderSnippet) this.renderSnippet();
      if (notify) this.onChange(this);
    }

    show(name, from) {
      const w = this.weights[name];
      const range = this.sliders[name];
      if (w > Number(range.max)) range.max = String(Math.ceil(w));
      if (from !== "range") range.value = String(w);
      if (from !== "number") this.numbers[name].value = fmtWeight(w);
      this.values[name].textContent = `weight ${fmtWeight(w)}`;
    }

    edit(name, w, from) {
      this.weights[name] = w;
      this.show(name, from);
      this.picker.value = "";
      this.describePick(null);
      if (this.renderSnippet) this.renderSnippet();
      this.onChange(this);
    }

    pick(value) {
      const option = this.options.find((o) => o.value === value);
      if (!option) { this.describePick(null); return; }
      this.picker.value = value;
      this.describePick(option);
      this.set(option.weights);
    }

    describePick(option) {
      const desc = $(`#${this.id}-preset-desc`, this.fieldset);
      desc.textContent = option
        ? `Sliders set to ${option.label.split(" — ")[0]}: ${this.weightText(option.weights)}`
        : "Custom weights: move a slider, or type an exact value.";
    }

    weightText(weights = this.weights) {
      return weighable().map((s) => `${s.name} ${fmtWeight(Number(weights[s.name]))}`).join(" · ");
    }

    copy() {
      return { ...this.weights };
    }
  }

  // ---------------------------------------------------------------- search tab
  const search = { sets: [], results: new Map(), timers: new Map(), controllers: new Map(), counter: 0 };

  function parseQuery() {
    const raw = $("#query").value;
    const text = raw.trim();
    const kind = $("#query-kind");
    if (!text) {
      kind.textContent = "Type a query; results follow every change.";
      return null;
    }
    if (text.startsWith("[") || text.startsWith("{")) {
      let vector;
      try {
        vector = JSON.parse(text);
      } catch (err) {
        kind.textContent = "Looks like a vector, but it is not valid JSON yet.";
        return { error: { type: "not_sent", status: 0, field: "queries[0].vector", message: `the pasted vector is not valid JSON (${err.message})` } };
      }
      const count = Array.isArray(vector) ? `${vector.length} numbers` : `an object with ${Object.keys(vector).length} subspace(s)`;
      kind.textContent = `Sent as a vector (${count}; the layout has D=${served.layout.dim}).`;
      return { query: { vector } };
    }
    kind.textContent = "Sent as text (encoded by the bundle's query encoder).";
    return { query: { text: raw } };
  }

  function kValue() {
    const input = $("#k");
    const k = Number(input.value);
    return Number.isInteger(k) ? k : input.value;
  }

  // A change supersedes the set's request in flight at once: only the newest answer is shown.
  function schedule(sets) {
    for (const set of sets) {
      const inFlight = search.controllers.get(set.id);
      if (inFlight) inFlight.abort();
      clearTimeout(search.timers.get(set.id));
      search.timers.set(set.id, setTimeout(() => runSearch(set), DEBOUNCE_MS));
      column(set).dataset.state = "pending";
    }
  }

  function activeSets() {
    return $("#compare").checked ? search.sets : search.sets.slice(0, 1);
  }

  async function runSearch(set) {
    const form = $("#search-form");
    const col = column(set);
    const parsed = parseQuery();
    clearErrors(form, set.fieldset);
    if (!parsed) {
      col.dataset.state = "idle";
      search.results.delete(set.id);
      renderColumns();
      return;
    }
    if (parsed.error) {
      col.dataset.state = "error";
      showError(form, parsed.error);
      return;
    }
    const previous = search.controllers.get(set.id);
    if (previous) previous.abort();
    const controller = new AbortController();
    search.controllers.set(set.id, controller);
    const body = { queries: [parsed.query], k: kValue(), weights: set.copy() };
    col.dataset.state = "loading";
    const started = performance.now();
    try {
      const data = await api("v1/search", { body, signal: controller.signal });
      if (controller.signal.aborted) return; // answered, but a newer change came first
      search.results.set(set.id, { data, ms: performance.now() - started, seq: ++search.counter });
      col.dataset.state = "ready";
    } catch (err) {
      if (err.name === "AbortError") return;
      search.results.delete(set.id);
      col.dataset.state = "error";
      showError(form, err, set.fieldset);
    } finally {
      if (search.controllers.get(set.id) === controller) search.controllers.delete(set.id);
    }
    renderColumns();
  }

  // The results box of a weight set (inside its column, below its sliders).
  function column(set) {
    let box = $(`#results-${set.id}`);
    if (!box) {
      box = el("div", { id: `results-${set.id}`, class: "hits-box", "aria-live": "polite", dataset: { state: "idle" } });
      $("#results").append(el("section", { id: `col-${set.id}`, class: "column", "aria-labelledby": `results-${set.id}-title` }, set.fieldset, box));
    }
    return box;
  }

  function rankMarker(rank, otherRank, otherName) {
    if (otherRank === undefined) return { text: `new: not in ${otherName}'s top k`, cls: "new" };
    const delta = otherRank - rank;
    if (delta > 0) return { text: `▲ up ${delta} (${otherName}: #${otherRank})`, cls: "up" };
    if (delta < 0) return { text: `▼ down ${-delta} (${otherName}: #${otherRank})`, cls: "down" };
    return { text: `= same rank (${otherName}: #${otherRank})`, cls: "same" };
  }

  function hitView(hit, rank, weights, marker) {
    const names = weighable().map((s) => s.name);
    const contributions = names.map((n) => (weights[n] ?? 0) * (hit.subspace_scores[n] ?? 0));
    const total = contributions.reduce((a, c) => a + Math.abs(c), 0) || 1;
    const rows = names.map((n, i) => {
      const cos = hit.subspace_scores[n] ?? 0;
      const c = contributions[i];
      const share = Math.round((Math.abs(c) / total) * 100);
      return el("tr", {},
        el("th", { scope: "row", text: n }),
        el("td", {}, bar(Math.abs(cos), cos < 0), el("span", { class: "num", text: fmt(cos) })),
        el("td", {}, bar(Math.abs(c) / total, c < 0),
          el("span", { class: "num", text: `${fmt(c)} = ${fmtWeight(weights[n] ?? 0)} × ${fmt(cos)} (${share}%)` })));
    });
    const label = [hit.title, hit.text].filter(Boolean).join(" — ") || "(no display text)";
    const short = label.length > TEXT_CHARS ? `${label.slice(0, TEXT_CHARS)}…` : label;
    return el("li", { class: "hit", dataset: { id: hit.id } },
      el("div", { class: "hit-head" },
        el("span", { class: "rank", text: `#${rank}` }),
        el("span", { class: "score", text: `score ${fmt(hit.score)}` }),
        el("span", { class: "doc-id", text: `id ${hit.id}` }),
        marker ? el("span", { class: `marker ${marker.cls}`, text: marker.text }) : null),
      el("p", { class: "text", title: label, text: short }),
      el("table", { class: "why" },
        el("caption", { text: "Why it ranks: per-subspace cosine, and weight × cosine (share of the score)" }),
        el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "subspace" }),
          el("th", { scope: "col", text: "cosine" }), el("th", { scope: "col", text: "weighted contribution" }))),
        el("tbody", {}, rows)));
  }

  function bar(fraction, negative) {
    const width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
    const inner = el("span", { class: negative ? "fill negative" : "fill" });
    inner.style.width = width;
    return el("span", { class: "bar", "aria-hidden": "true" }, inner);
  }

  function renderColumns() {
    const sets = activeSets();
    $("#results").classList.toggle("compare", sets.length > 1);
    for (const set of search.sets) $(`#col-${set.id}`).hidden = !sets.includes(set);
    const ranks = new Map();
    for (const set of sets) {
      const r = search.results.get(set.id);
      ranks.set(set.id, new Map(r ? r.data.results[0].hits.map((h, i) => [h.id, i + 1]) : []));
    }
    for (const set of sets) {
      const col = column(set);
      const r = search.results.get(set.id);
      const title = el("h2", { id: `results-${set.id}-title`, text: sets.length > 1 ? `Results ${set.label}` : "Results" });
      if (!r) {
        col.replaceChildren(title, el("p", { class: "hint", text: col.dataset.state === "error" ? "No results: see the error above." : "No results yet." }));
        delete col.dataset.weights;
        continue;
      }
      const other = sets.find((s) => s !== set);
      const otherRanks = other && search.results.get(other.id) ? ranks.get(other.id) : null;
      const used = r.data.weights_used;
      col.dataset.weights = JSON.stringify(used);
      const hits = r.data.results[0].hits;
      const list = el("ol", { class: "hits" },
        hits.map((h, i) => hitView(h, i + 1, used, otherRanks ? rankMarker(i + 1, otherRanks.get(h.id), other.label) : null)));
      col.replaceChildren(
        title,
        el("p", { class: "weights-used", text: `Weights: ${set.weightText(used)}` }),
        el("p", { class: "hint", text: `${hits.length} hits · bundle ${r.data.bundle_version} · ${r.data.backend} · ${Math.round(r.ms)} ms` }),
        list,
      );
    }
  }

  function initSearch() {
    const onChange = (set) => schedule([set]);
    const a = new WeightSet("A", "Weights A", onChange);
    const b = new WeightSet("B", "Weights B", onChange);
    a.label = "A";
    b.label = "B";
    search.sets = [a, b];
    for (const set of search.sets) column(set);
    $("#col-B").hidden = true;
    const initial = served.defaultPoint ? `op:${served.defaultPoint}` : "defaults";
    a.pick(initial);
    // B starts on a different point when there is one: the comparison then shows something.
    const other = a.options.find((o) => o.value !== initial && o.value !== "defaults");
    b.pick(other ? other.value : initial);
    $("#query").addEventListener("input", () => schedule(activeSets()));
    $("#k").addEventListener("input", () => schedule(activeSets()));
    $("#compare").addEventListener("change", () => {
      if ($("#compare").checked) schedule([b]);
      renderColumns();
    });
    $("#search-form").addEventListener("submit", (event) => {
      event.preventDefault();
      for (const set of activeSets()) runSearch(set);
    });
    renderColumns();
  }

  // ---------------------------------------------------------------- keyword clusters tab
  const clusters = { set: null, controller: null, timer: null, ran: false };

  function clusterBody() {
    const keywords = $("#keywords").value.split("\n").map((s) => s.trim()).filter(Boolean);
    const body = { keywords, weights: clusters.set.copy(), method: $("#method").value };
    const threshold = $("#threshold").value.trim();
    const minSize = $("#min-cluster-size").value.trim();
    if (body.method === "agglomerative" && threshold) body.threshold = Number(threshold);
    if (body.method === "hdbscan" && minSize) body.min_cluster_size = Number(minSize);
    return body;
  }

  async function runCluster() {
    const form = $("#cluster-form");
    const out = $("#cluster-out");
    clearErrors(form, clusters.set.fieldset);
    if (clusters.controller) clusters.controller.abort();
    clusters.controller = new AbortController();
    out.dataset.state = "loading";
    try {
      const controller = clusters.controller;
      const data = await api("v1/cluster", { body: clusterBody(), signal: controller.signal });
      if (controller.signal.aborted) return;
      clusters.ran = true;
      renderClusters(data);
      out.dataset.state = "ready";
    } catch (err) {
      if (err.name === "AbortError") return;
      out.dataset.state = "error";
      showError(form, err, clusters.set.fieldset);
    }
  }

  function dominantIntent(cluster) {
    const mix = Object.entries(cluster.intent_mix || {});
    if (!mix.length) return "none (no intent head)";
    const [intent, count] = mix[0];
    return `${intent} (${count} of ${cluster.size})`;
  }

  function renderClusters(data) {
    const members = new Map();
    for (const row of data.keywords) {
      if (!members.has(row.cluster_id)) members.set(row.cluster_id, []);
      members.get(row.cluster_id).push(row.keyword);
    }
    const body = data.clusters.map((c) => el("tr", { dataset: { cluster: c.cluster_id } },
      el("td", { text: c.cluster_id }),
      el("td", { text: c.size }),
      el("th", { scope: "row", text: c.label }),
      el("td", { class: "intent", text: dominantIntent(c) }),
      el("td", { text: Object.entries(c.intent_mix || {}).map(([k, v]) => `${k} ${v}`).join(", ") || "—" }),
      el("td", { text: fmt(c.mean_similarity_to_label) }),
      el("td", { text: (members.get(c.cluster_id) || []).join(", ") })));
    if (data.noise) {
      body.push(el("tr", { dataset: { cluster: -1 } },
        el("td", { text: "-1" }), el("td", { text: data.noise }), el("th", { scope: "row", text: "unclustered (noise)" }),
        el("td", { text: "—" }), el("td", { text: "—" }), el("td", { text: "—" }),
        el("td", { text: (members.get(-1) || []).join(", ") })));
    }
    const merged = data.duplicates.length
      ? `${data.duplicates.length} duplicate keyword(s) merged (case and spaces ignored). ` : "";
    $("#cluster-out").replaceChildren(
      el("h2", { text: "Clusters" }),
      el("p", { class: "hint", text: `${merged}${data.clusters.length} clusters, ${data.noise} unclustered · ${data.method} ${JSON.stringify(data.params)} · weights ${clusters.set.weightText(data.weights_used)} · bundle ${data.bundle_version}` }),
      el("table", { class: "clusters" },
        el("caption", { text: "Clusters by decreasing size; dominant intent = the members' most frequent predicted intent" }),
        el("thead", {}, el("tr", {}, ["cluster", "size", "label (most central keyword)", "dominant intent", "intent mix", "mean similarity to label", "members"].map((h) => el("th", { scope: "col", text: h })))),
        el("tbody", {}, body)));
  }

  function initClusters() {
    const onChange = () => {
      if (!clusters.ran) return;
      if (clusters.controller) clusters.controller.abort();
      $("#cluster-out").dataset.state = "pending";
      clearTimeout(clusters.timer);
      clusters.timer = setTimeout(runCluster, DEBOUNCE_MS);
    };
    clusters.set = new WeightSet("C", "Weights", onChange, { save: false });
    $("#cluster-weights").append(clusters.set.fieldset);
    clusters.set.pick(served.defaultPoint ? `op:${served.defaultPoint}` : "defaults");
    $("#method").addEventListener("change", () => {
      const hdbscan = $("#method").value === "hdbscan";
      $("[data-field=threshold]").hidden = hdbscan;
      $("[data-field=min_cluster_size]").hidden = !hdbscan;
    });
    $("#cluster-form").addEventListener("submit", (event) => {
      event.preventDefault();
      runCluster();
    });
  }

  // ---------------------------------------------------------------- tabs (arrow keys move between them)
  function initTabs() {
    const tabs = $$("[role=tab]");
    const select = (tab) => {
      for (const t of tabs) {
        const on = t === tab;
        t.setAttribute("aria-selected", String(on));
        t.tabIndex = on ? 0 : -1;
        $(`#${t.getAttribute("aria-controls")}`).hidden = !on;
      }
      tab.focus();
    };
    tabs.forEach((tab, i) => {
      tab.addEventListener("click", () => select(tab));
      tab.addEventListener("keydown", (event) => {
        const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
        if (step) {
          event.preventDefault();
          select(tabs[(i + step + tabs.length) % tabs.length]);
        }
      });
    });
  }

  // ---------------------------------------------------------------- start
  async function start() {
    initTabs();
    const status = $("#status");
    const pageError = $("#page-error");
    for (;;) {
      try {
        const [ready, layout, points, experiments] = await Promise.all([
          api("readyz"), api("v1/layout"), api("v1/operating-points"), api("v1/experiments"),
        ]);
        served.layout = layout;
        served.points = points.operating_points;
        served.defaultPoint = points.default_operating_point;
        served.experiments = experiments.experiments;
        served.version = layout.bundle_version;
        const dims = [...layout.subspaces.map((s) => `${s.name} ${s.dim}`),
          ...(layout.sparse || []).map((s) => `${s.name} sparse`)].join(", ");
        status.textContent = `Bundle ${layout.bundle_version}: ${ready.num_docs} documents, D=${layout.dim} (${dims}), backend ${ready.backend}.`;
        pageError.hidden = true;
        break;
      } catch (err) {
        pageError.textContent = `${describeError(err)} — retrying in 2 s.`;
        pageError.hidden = false;
        await new Promise((resolve) => setTimeout(resolve, 2000));
      }
    }
    initSearch();
    initClusters();
    document.body.dataset.ready = "true";
  }

  start();
})();
