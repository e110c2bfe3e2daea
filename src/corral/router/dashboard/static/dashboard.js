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
    if (e.load && typeof e.load.kv_usage === "number") return Math.round(e.load.kv_usage * 100) + "%";
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
    // a window younger than its span (the router started less than a minute ago) says how old it is
    $("window").textContent = !windows.window_s ? "" : windows.covered_s < windows.window_s
      ? `· since the router started (${Math.round(windows.covered_s)} s)` : `· last ${Math.round(windows.window_s)} s`;
    const ms = (v) => (v === null || v === undefined ? "–" : Math.round(v) + " ms");
    return Object.keys(windows.models).sort().map((m) => {
      const f = windows.models[m];
      const errs = f.error_share === null ? "–" : (100 * f.error_share).toFixed(1) + "% (" + f.errors + ")";
      const name = el("span", m, "mono");
      if ((f.adapters || []).length) name.append(el("span", " + " + f.adapters.join(", "), "sub"));
      const total = f.total === null || f.total === undefined ? String(f.requests) : String(f.total);
      const tr = row([name, f.rate === null ? "–" : f.rate.toFixed(2), total, errs,
        ms(f.ttft_mean_ms), ms(f.ttft_p95_ms)]);
      tr.lastChild.className = "";
      tr.children[2].title = "requests the router answered for this model since it started (kept when engines leave)";
      tr.dataset.model = m;
      tr.dataset.requests = String(f.requests);
      tr.dataset.total = total;
      return tr;
    });
  }

  // why an engine takes no requests, in a person's words; the router's own reason on hover
  const NOT_ROUTABLE = {
    DRAINING: "draining: it takes no new requests", SLEEPING: "asleep", STARTING: "its engine is starting",
    WAKING: "waking up", STOPPING: "stopping", FAILED: "its engine failed", PAUSED: "paused",
  };
  function routableCell(e) {
    if (e.routable) return el("span", "yes", "yes");
    const raw = String(e.why || e.reason || "?").replace(/^not routable: /, "");
    const cell = el("span", "no — " + (NOT_ROUTABLE[stateOf(e)] || raw), "no");
    cell.title = raw;
    return cell;
  }

  function render(fleet) {
    const endpoints = fleet.endpoints || [];
    const ready = endpoints.filter((e) => stateOf(e) === "READY").length;
    $("summary").textContent = `${endpoints.length} engine(s), ${ready} READY · policy ${fleet.policy || "?"}`;
    fill($("engines").tBodies[0], endpoints.map((e) => {
      const sv = e.supervisor || {};
      // the bundle's name as `corral status` prints it; its fingerprint on hover (and where no name is said)
      const bundle = el("span", sv.bundle_name || (sv.fingerprint ? sv.fingerprint.slice(0, 12) : "–"),
        sv.bundle_name ? "" : "mono");
      if (sv.fingerprint) bundle.title = "bundle fingerprint " + sv.fingerprint;
      bundle.dataset.bundle = sv.bundle_name || "";
      const ramp = e.slow_start ? Math.round(e.slow_start.weight * 100) + "%" : "–";
      const routable = routableCell(e);
      const tr = row([el("b", engineName(e)), badge(e), e.role || sv.role || "–", e.group || "–",
        bundle, String(e.in_flight ?? 0), kv(e), adapters(e), ramp, routable]);
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
    rolloutBanner(fleet.rollout);
    flowQueue(fleet.flow);
  }

  // a rollout in flight (or the last one, for a while): bundles by name, groups moved, requests failed
  function rolloutBanner(rollout) {
    const box = $("rollout");
    const r = rollout && (rollout.active || rollout.last);
    box.hidden = !r;
    if (!r) return;
    const ended = !rollout.active;
    box.className = "banner" + (ended ? " ended" : "");
    box.dataset.state = ended ? "ended" : "active";
    box.dataset.from = r.from.join(", ");
    box.dataset.to = r.to;
    box.dataset.failed = String(r.failed);
    const failed = `${r.failed} request${r.failed === 1 ? "" : "s"} failed`;
    box.replaceChildren(ended ? "Last rollout: bundle " : "Rollout in progress: bundle ",
      el("b", r.from.join(", ")), " → ", el("b", r.to),
      ended ? ` · ended ${clock(r.ended)} · ${r.groups_moved} group(s) on ${r.to} · ${failed}`
        : ` · ${r.groups_moved} group(s) on ${r.to} of ${r.groups} to move · ${failed} so far · since ${clock(r.since)}`);
  }

  // the router's queue, when flow control is on (`flow` in /v1/fleet)
  function flowQueue(flow) {
    const section = $("flow");
    section.hidden = !flow || typeof flow !== "object";
    if (section.hidden) return;
    const parts = (o) => Object.entries(o || {}).map(([k, n]) => `${k}: ${n}`).join(", ") || "none";
    const age = flow.oldest_age_seconds == null ? "" : `, the oldest for ${flow.oldest_age_seconds.toFixed(1)} s`;
    const body = $("flow-body");
    body.dataset.depth = String(flow.depth ?? 0);
    body.replaceChildren(
      el("div", `${flow.depth ?? 0} request(s) waiting in the router${age}`),
      el("div", `by band: ${parts(flow.depth_by_band)} · by tenant: ${parts(flow.depth_by_tenant)}`, "sub"),
      el("div", `turned away: ${parts(flow.shed)} · sent on: ${flow.dispatched ?? 0}`, "sub"));
  }

  // routing exits and runbook steps, both on the router's clock: the last 20 of them together, newest first
  const EVENTS_SHOWN = 20;
  const clock = (at) => (at ? new Date(at * 1000).toLocaleTimeString() : "");
  // an exit from routing in a person's words; the router's own record on hover and in data-raw
  const host = (url) => String(url).replace(/^https?:\/\//, "").replace(/\/.*$/, "");
  const EXIT_WORDS = {
    supervisor_draining: "stopped taking new requests: its supervisor is draining it",
    supervisor_sleeping: "stopped taking requests: it was put to sleep",
    supervisor_starting: "is not taking requests: its engine is starting",
    supervisor_waking: "is not taking requests: it is waking up",
    supervisor_failed: "stopped taking requests: its engine failed",
    supervisor_stopped: "stopped taking requests: its engine stopped",
    supervisor_unhealthy: "stopped taking requests: its engine is unhealthy",
    supervisor_stream_lost: "stopped taking requests: the router lost touch with its supervisor",
    supervisor_stream_stale: "stopped taking requests: its supervisor went silent",
    group_out: "stopped taking requests: its serving group is not whole",
    held: "is held back: it is not taking requests yet",
    probe_failed: "stopped taking requests: it did not answer the router's health check",
    replaced: "was replaced by a new engine at the same address",
  };
  // where a removed engine was listed, as its discovery source's removal cause names it
  const SOURCES = { file: "the router's backends file", static: "the router's --backend list", k8s: "Kubernetes" };
  function exitWords(x, rollout) {
    let words = EXIT_WORDS[x.cause];
    const source = /^(.*)_removed$/.exec(x.cause || "");
    if (!words && x.kind === "removed") {
      words = source ? `left the fleet: ${SOURCES[source[1]] || source[1]} no longer lists it` : "left the fleet";
    }
    if (!words) words = x.kind === "removed" ? "left the fleet" : "stopped taking requests";
    const during = rollout && (rollout.leaving || []).includes(x.url); // an engine the rollout moved off
    // a sleep says so in its reason; a rollout's drain does not, so an engine the rollout moved off is asked
    if (x.cause === "supervisor_draining" && /sleep/i.test(x.reason || "")) words += " before it sleeps";
    else if (x.cause === "supervisor_draining" && (during || /rollout|bundle/i.test(x.reason || ""))) words += " for a rollout";
    // "engine g2 (127.0.0.1:8012)"; a name that says it is an engine already is not said twice
    const name = x.name ? (/^engine/i.test(x.name) ? x.name : "engine " + x.name) : "engine";
    return `${name} (${host(x.url)}) ${words}`;
  }
  function exitItem(x, fleet) {
    const rollout = fleet.rollout && (fleet.rollout.active || fleet.rollout.last);
    const li = el("li", `${clock(x.at)} ${exitWords(x, rollout)}`);
    const raw = `${x.kind} (${x.cause})` + (x.reason ? ` — ${x.reason}` : "");
    li.title = raw; // the router's own words, for whoever needs them
    li.dataset.raw = raw;
    li.dataset.cause = x.cause;
    return li;
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
    return last.length ? last.map(([, item, x]) => item(x, fleet))
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
