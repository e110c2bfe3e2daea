"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const el = (tag, text, cls) => {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  };
  const row = (cells) => {
    const tr = el("tr");
    for (const cell of cells) {
      const td = el("td");
      if (cells.indexOf(cell) === cells.length - 1) td.className = "why";
      if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell ?? "–";
      tr.appendChild(td);
    }
    return tr;
  };
  const fill = (node, children) => node.replaceChildren(...children);
  const engineName = (e) => e.name || e.url.replace(/^https?:\/\//, "");
  const stateOf = (e) => (e.supervisor && e.supervisor.state) || e.state || "unknown";
  const STEPS = { drain_policy: "DRAIN" }; // the runbook's step names as the runbook document writes them
  const stepName = (step) => STEPS[step] || String(step).replace(/_/g, " ").toUpperCase();
  const seconds = (since) => {
    const s = Math.max(0, Date.now() / 1000 - since);
    return s < 60 ? s.toFixed(1) + " s" : Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  };
  // "sleep (level 1) · DRAIN · 1.2 s": the elapsed part is a span the clock below keeps current
  function operation(op) {
    const span = el("span", null, "op");
    span.dataset.kind = op.kind;
    span.dataset.step = op.step;
    span.append(`${op.kind}${op.detail ? " (" + op.detail + ")" : ""} · `, el("b", stepName(op.step)));
    if (typeof op.since === "number") {
      const t = el("span", " · " + seconds(op.since), "elapsed");
      t.dataset.since = String(op.since);
      span.append(t);
    }
    return span;
  }
  setInterval(() => {
    for (const t of document.querySelectorAll("span.elapsed")) t.textContent = " · " + seconds(Number(t.dataset.since));
  }, 1000);

  function badge(e) {
    const span = el("span");
    const state = stateOf(e);
    const b = el("span", state, "badge s-" + state);
    b.dataset.state = state;
    span.appendChild(b);
    const sub = e.supervisor && e.supervisor.sub_state;
    if (sub) span.appendChild(el("span", " " + sub, "sub"));
    const op = e.supervisor && e.supervisor.operation;
    if (op) span.append(el("br"), operation(op));
    return span;
  }

  function kv(e) {
    const k = e.kv_events;
    if (!k) return "–";
    if (typeof k.usage === "number") return Math.round(k.usage * 100) + "%";
    return k.blocks !== undefined ? k.blocks + " blocks" : "known";
  }

  function adapters(e) {
    const names = e.adapters || [];
    if (!names.length) return "–";
    const withdrawn = new Set(e.withdrawn || []);
    const span = el("span", null, "mono");
    span.dataset.adapters = names.join(" ");
    names.forEach((name, i) => {
      if (i) span.append(", ");
      span.append(withdrawn.has(name) ? el("s", name, "no") : name);
    });
    return span;
  }

  function modelRows(fleet) {
    const windows = fleet.model_windows || { models: {} };
    // a window younger than its span (no dashboard was open a minute ago) says how old it is
    $("window").textContent = !windows.window_s ? "" : windows.covered_s < windows.window_s
      ? `· since the dashboard opened (${Math.round(windows.covered_s)} s)` : `· last ${Math.round(windows.window_s)} s`;
    const ms = (v) => (v === null || v === undefined ? "–" : Math.round(v) + " ms");
    return Object.keys(windows.models).sort().map((m) => {
      const f = windows.models[m];
      const errs = f.error_share === null ? "–" : (100 * f.error_share).toFixed(1) + "% (" + f.errors + ")";
      const name = el("span", m, "mono");
      if ((f.adapters || []).length) name.append(el("span", " + " + f.adapters.join(", "), "sub"));
      const tr = row([name, f.rate === null ? "–" : f.rate.toFixed(2), errs,
        ms(f.ttft_mean_ms), ms(f.ttft_p95_ms)]);
      tr.lastChild.className = "";
      tr.dataset.model = m;
      tr.dataset.requests = String(f.requests);
      return tr;
    });
  }

  function render(fleet) {
    const endpoints = fleet.endpoints || [];
    const ready = endpoints.filter((e) => stateOf(e) === "READY").length;
    $("summary").textContent = `${endpoints.length} engine(s), ${ready} READY · policy ${fleet.policy || "?"}`;
    fill($("engines").tBodies[0], endpoints.map((e) => {
      const sv = e.supervisor || {};
      const fp = sv.fingerprint ? sv.fingerprint.slice(0, 12) : "–";
      const ramp = e.slow_start ? Math.round(e.slow_start.weight * 100) + "%" : "–";
      const routable = el("span", e.routable ? "yes" : "no — " + String(e.why || e.reason || "?").replace(/^not routable: /, ""), e.routable ? "yes" : "no");
      const tr = row([el("b", engineName(e)), badge(e), e.role || sv.role || "–", e.group || "–",
        el("span", fp, "mono"), String(e.in_flight ?? 0), kv(e), adapters(e), ramp, routable]);
      tr.dataset.engine = engineName(e);
      tr.dataset.url = e.url;
      tr.dataset.state = stateOf(e);
      return tr;
    }));
    fill($("groups"), (fleet.groups || []).map((g) => {
      const li = el("li");
      li.dataset.group = g.name;
      li.append(el("b", g.name), " ", el("span", g.whole ? "whole" : "not whole", g.whole ? "yes" : "no"),
        el("span", ` · ${g.members.length}/${g.size ?? "?"} members · ${g.why}`, "sub"));
      return li;
    }));
    const ops = [];
    for (const e of endpoints) {
      const sv = e.supervisor;
      if (!sv) continue;
      const state = sv.state || "";
      if (sv.operation) {
        const li = el("li");
        li.dataset.engine = engineName(e);
        li.dataset.step = sv.operation.step;
        li.append(el("b", engineName(e)), ": ", operation(sv.operation), el("span", ` — ${state}` +
          (sv.sub_state ? " / " + sv.sub_state : ""), "sub"));
        ops.push(li);
      } else if (state !== "READY" || sv.sub_state) {
        ops.push(el("li", `${engineName(e)}: ${state}${sv.sub_state ? " / " + sv.sub_state : ""}` +
          (sv.reason ? ` — ${sv.reason}` : "")));
      }
      // the removal epoch is the one leaving routing; later DRAINING epochs are not acknowledged
      if (state === "DRAINING" && sv.sub_state === "leaving_routing" && sv.epoch != null &&
          (sv.acked_epoch == null || sv.acked_epoch < sv.epoch)) {
        ops.push(el("li", `${engineName(e)}: drain waits for acknowledgement (epoch ${sv.epoch}, acked ${sv.acked_epoch})`, "no"));
      }
    }
    fill($("ops"), ops.length ? ops : [el("li", "none in flight", "sub")]);
    fill($("models").tBodies[0], modelRows(fleet));
    fill($("events"), recentEvents(fleet));
  }

  // routing exits and runbook steps, both on the router's clock: the last 20 of them together, newest first
  const EVENTS_SHOWN = 20;
  const clock = (at) => (at ? new Date(at * 1000).toLocaleTimeString() : "");
  function exitItem(x) {
    return el("li", `${clock(x.at)} ${x.name || x.url} ${x.kind} (${x.cause})` + (x.reason ? ` — ${x.reason}` : ""));
  }
  function stepItem(x) {
    const li = el("li", null, "step");
    li.dataset.engine = x.name || x.url;
    li.dataset.kind = x.kind;
    li.dataset.step = x.ended ? "ended" : x.step;
    li.append(`${clock(x.at)} ${x.name || x.url} ${x.kind}${x.detail ? " (" + x.detail + ")" : ""}`,
      x.ended ? " ended" : " · ", x.ended ? "" : el("b", stepName(x.step)));
    return li;
  }
  function recentEvents(fleet) {
    const exits = (fleet.left_routing || []).slice(-EVENTS_SHOWN).map((x) => [x.at || 0, exitItem, x]);
    const steps = (fleet.operation_steps || []).slice(-EVENTS_SHOWN).map((x) => [x.at || 0, stepItem, x]);
    const last = [...exits, ...steps].sort((a, b) => a[0] - b[0]).slice(-EVENTS_SHOWN).reverse();
    return last.length ? last.map(([, item, x]) => item(x))
      : [el("li", "no engine has left routing or run an operation yet", "sub")];
  }

  function setConn(live) {
    const c = $("conn");
    c.textContent = live ? "● live" : "○ reconnecting…";
    c.className = "conn " + (live ? "live" : "down");
    c.dataset.state = live ? "live" : "reconnecting";
  }

  const source = new EventSource("dashboard/events");
  source.onopen = () => setConn(true);
  source.onerror = () => setConn(false);
  source.addEventListener("fleet", (event) => {
    setConn(true);
    const fleet = JSON.parse(event.data);
    if (fleet.error) { $("summary").textContent = fleet.error; return; }
    render(fleet);
  });
})();
