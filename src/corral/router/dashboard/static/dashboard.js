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
  let previous = null; // {at, byModel} for rates

  function badge(e) {
    const span = el("span");
    const state = stateOf(e);
    const b = el("span", state, "badge s-" + state);
    b.dataset.state = state;
    span.appendChild(b);
    const sub = e.supervisor && e.supervisor.sub_state;
    if (sub) span.appendChild(el("span", " " + sub, "sub"));
    return span;
  }

  function kv(e) {
    const k = e.kv_events;
    if (!k) return "–";
    if (typeof k.usage === "number") return Math.round(k.usage * 100) + "%";
    return k.blocks !== undefined ? k.blocks + " blocks" : "known";
  }

  function modelRows(fleet) {
    const now = Date.now() / 1000;
    const byModel = {};
    for (const e of fleet.endpoints || []) {
      const t = e.traffic || {};
      const ttft = t.ttft || {};
      const count = (ttft.counts || []).reduce((a, b) => a + b, 0);
      for (const m of e.models || []) {
        const acc = (byModel[m] ||= { requests: 0, errors: 0, ttftSum: 0, ttftCount: 0 });
        acc.requests += t.requests || 0; acc.errors += t.errors || 0;
        acc.ttftSum += ttft.sum || 0; acc.ttftCount += count;
      }
    }
    const rows = Object.keys(byModel).sort().map((m) => {
      const now_ = byModel[m], before = previous && previous.byModel[m];
      const dt = previous ? now - previous.at : 0;
      const dReq = before ? now_.requests - before.requests : 0;
      const rate = dt > 0 && before ? (dReq / dt).toFixed(2) : "–";
      const errs = now_.requests ? ((100 * now_.errors) / now_.requests).toFixed(1) + "%" : "0%";
      const ttft = now_.ttftCount ? ((1000 * now_.ttftSum) / now_.ttftCount).toFixed(0) + " ms" : "–";
      return row([el("span", m, "mono"), rate, errs + " (" + now_.errors + ")", ttft]);
    });
    previous = { at: now, byModel };
    return rows;
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
        el("span", fp, "mono"), String(e.in_flight ?? 0), kv(e), "–", ramp, routable]);
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
      if (state !== "READY" || sv.sub_state) {
        ops.push(el("li", `${engineName(e)}: ${state}${sv.sub_state ? " / " + sv.sub_state : ""}` +
          (sv.reason ? ` — ${sv.reason}` : "")));
      }
      if (state === "DRAINING" && sv.epoch != null && sv.acked_epoch != null && sv.acked_epoch < sv.epoch) {
        ops.push(el("li", `${engineName(e)}: drain waits for acknowledgement (epoch ${sv.epoch}, acked ${sv.acked_epoch})`, "no"));
      }
    }
    fill($("ops"), ops.length ? ops : [el("li", "none in flight", "sub")]);
    fill($("models").tBodies[0], modelRows(fleet));
    const exits = (fleet.left_routing || []).slice(-20).reverse();
    fill($("events"), exits.length ? exits.map((x) => el("li",
      `${x.at ? new Date(x.at * 1000).toLocaleTimeString() : ""} ${x.name || x.url} ${x.kind} (${x.cause})` +
      (x.reason ? ` — ${x.reason}` : ""))) : [el("li", "no engine has left routing yet", "sub")]);
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
