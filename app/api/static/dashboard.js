// The planner's live dashboard (app/api/routes/dashboard.py): polls the JSON API and draws, per
// deployment, the load, the replicas against their targets, TTFT and ITL against the SLA, and for
// SLA scaling its demand, forecast headroom, measured scale and correction, lead and wishes, with
// the decisions and their reasons; for a deployment in shadow mode, the incumbent's counts beside
// the planner's and how often they agree (GET /deployments/{name}/shadow). Query parameters:
// refresh_s (default 2), window_s (planner seconds of ticks kept, default 3600). A token:
// `#token=...` once, or the form.
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  const REFRESH_MS = 1000 * Math.max(0.5, Number(params.get("refresh_s")) || 2);
  const WINDOW_S = Math.max(60, Number(params.get("window_s")) || 3600);
  const PAGE = 1000; // the API's largest page
  const ROLES = ["prefill", "decode", "workers"];
  const COLOURS = { prefill: "#1f77b4", decode: "#ff7f0e", workers: "#2ca02c" };
  const TOKEN_KEY = "planner-dashboard-token";

  const CHARTS = [
    { id: "rate", title: "Load: request rate (req/s)", y: "req/s" },
    { id: "replicas", title: "Replicas: ready (solid), target (dotted), fleet grant (dash-dot)", y: "engines" },
    { id: "ttft", title: "TTFT (ms), observed mean against the target", y: "ms", log: true },
    { id: "itl", title: "ITL (ms), observed mean against the target", y: "ms", log: true },
    { id: "wishes", title: "SLA scaling: wish (solid) and need (dotted) per role", y: "engines" },
    { id: "headroom", title: "SLA scaling: forecast headroom (peak within one lead ÷ level)", y: "×" },
    { id: "scale", title: "SLA scaling: measured scale and capacity correction", y: "×" },
    { id: "lead", title: "SLA scaling: lead (s), measured or the start-up estimate", y: "s" },
  ];
  // Only for a deployment in shadow mode.
  const SHADOW_CHART = {
    id: "shadow", title: "Shadow mode: engines the incumbent ran (solid), the planner would have ordered (dotted)", y: "engines",
  };
  const MAX_SHADOW_WINDOW_S = 86400; // the report's largest window

  // --- auth -------------------------------------------------------------------------------------

  function takeTokenFromFragment() {
    const match = location.hash.match(/token=([^&]+)/);
    if (match) {
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
      history.replaceState(null, "", location.pathname + location.search);
    }
  }

  function headers() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    return token ? { Authorization: "Bearer " + token } : {};
  }

  class AuthError extends Error {}

  async function getJson(path) {
    const resp = await fetch(path, { headers: headers(), cache: "no-store" });
    if (resp.status === 401 || resp.status === 403) {
      let detail = resp.statusText;
      try { detail = (await resp.json()).detail || detail; } catch (e) { /* not JSON */ }
      throw new AuthError(detail);
    }
    if (!resp.ok) throw new Error(path + " answered " + resp.status);
    return resp.json();
  }

  function askForToken(message) {
    const form = document.getElementById("auth");
    form.hidden = false;
    document.getElementById("auth-message").textContent = message;
  }

  // --- reading tick records (as app/reports/diagnostics/read.py does) ----------------------------

  function num(v) {
    return typeof v === "number" && isFinite(v) ? v : null;
  }

  function ratio(a, b) {
    const x = num(a), y = num(b);
    return x !== null && y ? x / y : null;
  }

  function counts(v) {
    const out = {};
    if (v && typeof v === "object") for (const [k, n] of Object.entries(v)) if (num(n) !== null) out[k] = n;
    return out;
  }

  function readTick(tick) {
    const r = tick.record || {};
    const traffic = (r.traffic && r.traffic.observed) || null;
    const tp = r.throughput || null;
    const tpObserved = (tp && tp.observed) || {};
    const sla = r.sla || null;
    const load = r.load || null;
    const demand = (sla && sla.demand) || {};
    const growth = Array.isArray(demand.growth) ? demand.growth : [];
    const roles = (sla && sla.roles) || {};
    const row = {
      t: tick.at,
      id: tick.id,
      decision: tick.decision_id,
      rate: traffic ? ratio(traffic.num_req, traffic.duration_s) : ratio(tpObserved.num_req, tpObserved.duration_s),
      demand: num(demand.request_rate_s),
      ttft: num(traffic ? traffic.ttft_ms : tpObserved.ttft_ms),
      itl: num(traffic ? traffic.itl_ms : tpObserved.itl_ms),
      ready: counts((sla && sla.ready) || (load && load.current)),
      target: counts(r.target),
      wish: {},
      need: {},
      grant: {}, // the fleet grant the tick ran under, per role (its maximum)
      headroomTokens: num(growth[0]),
      headroomFlight: num(growth[1]),
      headroomLearned: demand.growth_learned === true,
      scale: counts(sla && sla.scale),
      correction: num(sla && sla.capacity_check && sla.capacity_check.correction),
      lead: num(sla && sla.lead_s),
      leadMeasured: !!(sla && sla.lead_measured),
      reason: (sla && sla.reason) || (load && load.reason) || (tp && tp.reason) || null,
      // Per role, an order whose engines did not come within the wait bound (docs/scaling.md).
      unavailable: (sla && sla.capacity_unavailable) || null,
      sla: !!sla,
      // Shadow mode: per role what the incumbent ran and what the planner would have ordered.
      shadow: { incumbent: {}, planner: {} },
    };
    const shadowRoles = (r.shadow && r.shadow.roles) || {};
    for (const [role, s] of Object.entries(shadowRoles)) {
      if (num(s.incumbent) !== null) row.shadow.incumbent[role] = s.incumbent;
      if (num(s.planner) !== null) row.shadow.planner[role] = s.planner;
    }
    const fleetRoles = (r.fleet && r.fleet.roles) || {};
    for (const [role, g] of Object.entries(fleetRoles)) if (num(g.granted) !== null) row.grant[role] = g.granted;
    for (const [role, section] of Object.entries(roles)) {
      if (num(section.wish) !== null) row.wish[role] = section.wish;
      if (num(section.needed) !== null) row.need[role] = section.needed;
    }
    return row;
  }

  // --- one deployment ---------------------------------------------------------------------------

  class DeploymentView {
    constructor(info, since) {
      this.name = info.name;
      this.info = info;
      this.since = since;
      this.ticks = [];
      this.decisions = new Map();
      this.section = document.createElement("section");
      this.section.className = "deployment";
      this.section.dataset.deployment = this.name;
      const title = document.createElement("h2");
      title.textContent = this.name;
      this.facts = document.createElement("p");
      this.facts.className = "facts";
      const grid = document.createElement("div");
      grid.className = "grid";
      this.charts = {};
      for (const spec of info.shadow ? [SHADOW_CHART, ...CHARTS] : CHARTS) {
        const div = document.createElement("div");
        div.className = "chart";
        div.id = this.name + "-" + spec.id;
        div.dataset.chart = spec.id;
        div.dataset.points = "0";
        grid.appendChild(div);
        this.charts[spec.id] = div;
      }
      this.table = document.createElement("table");
      this.table.className = "decisions";
      // What the window's engines cost (GET /diagnostics/cost over the ticks shown).
      this.cost = document.createElement("p");
      this.cost.className = "facts cost";
      this.cost.dataset.cost = "";
      this.section.append(title, this.facts, this.cost);
      if (info.shadow) {
        this.shadow = document.createElement("p");
        this.shadow.className = "facts shadow";
        this.shadow.dataset.agreement = "";
        this.section.append(this.shadow);
      }
      this.section.append(grid, this.table);
      document.getElementById("deployments").appendChild(this.section);
    }

    async poll(info) {
      this.info = info;
      // Only the ticks after the last one shown: /diagnostics pages go backwards (`cursor` gives
      // the ticks before it), so read the newest pages from the last tick's time (or the window's
      // start) until a page reaches what is already shown.
      const base = "diagnostics?deployment=" + encodeURIComponent(this.name) + "&limit=" + PAGE;
      const shown = this.ticks.length ? this.ticks[this.ticks.length - 1] : null;
      const from = shown ? shown.t : this.since;
      const fresh = [];
      let cursor = null;
      for (;;) {
        const url = base + (from ? "&since=" + encodeURIComponent(from) : "") + (cursor !== null ? "&cursor=" + cursor : "");
        const page = await getJson(url);
        const items = page.items.filter((t) => !shown || t.id > shown.id);
        fresh.unshift(...items);
        if (page.next_cursor === null || page.next_cursor === undefined || items.length < page.items.length) break;
        cursor = page.next_cursor;
      }
      for (const tick of fresh) this.ticks.push(readTick(tick));
      if (this.ticks.length) {
        const last = Date.parse(this.ticks[this.ticks.length - 1].t);
        const keepFrom = last - WINDOW_S * 1000;
        let drop = 0;
        while (drop < this.ticks.length && Date.parse(this.ticks[drop].t) < keepFrom) drop++;
        if (drop) this.ticks.splice(0, drop);
      }
      // The latest decisions, again: their status changes after they are made.
      const seen = Math.max(0, ...this.decisions.keys());
      const after = Math.max(0, seen - 20);
      const page = await getJson(
        "decisions?deployment=" + encodeURIComponent(this.name) + "&after=" + after + "&limit=" + PAGE
      );
      for (const d of page.items) this.decisions.set(d.id, d);
      if (this.ticks.length) {
        const from = this.ticks[0].t;
        this.costReport = await getJson("diagnostics/cost?deployment=" + encodeURIComponent(this.name) + "&since=" + encodeURIComponent(from));
      }
      if (this.info.shadow) {
        const windowS = Math.min(WINDOW_S, MAX_SHADOW_WINDOW_S);
        this.shadowReport = await getJson("deployments/" + encodeURIComponent(this.name) + "/shadow?window_s=" + windowS);
      }
      this.render();
      this.renderCost();
      if (this.info.shadow) this.renderShadow();
    }

    render() {
      const info = this.info;
      const ticks = this.ticks;
      const sla = info.sla || {};
      const last = ticks.length ? ticks[ticks.length - 1] : null;
      const roles = ROLES.filter((r) => ticks.some((t) => r in t.target || r in t.ready) || (info.roles && r in info.roles));
      const facts = [
        ["mode", info.mode],
        ["connector", info.connector + (info.shadow ? " (shadow mode: nothing is written)" : "")],
        ["SLA", `TTFT ${sla.ttft_ms} ms, ITL ${sla.itl_ms} ms`],
        ["ready", info.ready ? fmtCounts(info.ready) : "unknown"],
        ["desired", info.desired ? fmtCounts(info.desired) : "none yet"],
        ["paused", info.paused ? "yes" : "no"],
        ...(info.fleet ? [["fleet grant", fleetText(info.fleet)]] : []),
        ["ticks shown", String(ticks.length)],
        ["last tick", last ? `${last.t} (${last.reason || "no reason"})` : "none yet"],
        ...(last && last.unavailable ? [["capacity unavailable", unavailableText(last.unavailable)]] : []),
      ];
      this.facts.innerHTML = "";
      for (const [k, v] of facts) {
        const b = document.createElement("b");
        b.textContent = k + ": ";
        this.facts.append(b, document.createTextNode(v + "   "));
      }
      const x = ticks.map((t) => t.t);
      const x0 = x[0], x1 = x[x.length - 1];
      const slaTicks = ticks.some((t) => t.sla);
      const noSla = slaTicks ? "no data in the ticks yet" : "this deployment does not use SLA scaling";

      this.draw("rate", [
        line("observed", x, ticks.map((t) => t.rate)),
        line("SLA demand (sized for)", x, ticks.map((t) => t.demand), { dash: "dash" }),
      ], "no traffic observed yet");

      const replicaTraces = [];
      for (const role of roles) {
        replicaTraces.push(line(role + " ready", x, ticks.map((t) => t.ready[role] ?? null), { colour: COLOURS[role], shape: "hv" }));
        replicaTraces.push(line(role + " target", x, ticks.map((t) => t.target[role] ?? null), { colour: COLOURS[role], dash: "dot", shape: "hv" }));
        if (ticks.some((t) => role in t.grant)) {
          replicaTraces.push(line(role + " fleet grant", x, ticks.map((t) => t.grant[role] ?? null), { colour: COLOURS[role], dash: "dashdot", shape: "hv", width: 1 }));
        }
        const decided = ticks.filter((t) => t.decision !== null && t.decision !== undefined && role in t.target);
        replicaTraces.push({
          type: "scatter", mode: "markers", name: role + " decision",
          x: decided.map((t) => t.t), y: decided.map((t) => t.target[role]),
          marker: { color: COLOURS[role], symbol: "diamond", size: 8 },
          text: decided.map((t) => decisionText(this.decisions.get(t.decision), t.decision)),
          hovertemplate: "%{text}<extra></extra>",
        });
      }
      this.draw("replicas", replicaTraces, "no replica counts in the ticks yet");
      if (info.shadow) {
        const shadowTraces = [];
        for (const role of roles) {
          shadowTraces.push(line(role + " incumbent", x, ticks.map((t) => t.shadow.incumbent[role] ?? null), { colour: COLOURS[role], shape: "hv" }));
          shadowTraces.push(line(role + " planner", x, ticks.map((t) => t.shadow.planner[role] ?? null), { colour: COLOURS[role], dash: "dot", shape: "hv" }));
        }
        this.draw("shadow", shadowTraces, "no shadow tick yet");
      }

      this.draw("ttft", [
        line("observed TTFT", x, ticks.map((t) => t.ttft)),
        target("TTFT target " + sla.ttft_ms + " ms", x0, x1, sla.ttft_ms),
      ], "no request completed its first token yet");
      this.draw("itl", [
        line("observed ITL", x, ticks.map((t) => t.itl)),
        target("ITL target " + sla.itl_ms + " ms", x0, x1, sla.itl_ms),
      ], "no request finished decoding yet");

      const wishTraces = [];
      for (const role of roles) {
        wishTraces.push(line(role + " wish", x, ticks.map((t) => t.wish[role] ?? null), { colour: COLOURS[role], shape: "hv" }));
        wishTraces.push(line(role + " need", x, ticks.map((t) => t.need[role] ?? null), { colour: COLOURS[role], dash: "dot", shape: "hv" }));
      }
      this.draw("wishes", wishTraces, noSla);
      this.draw("headroom", [
        line("prompt tokens", x, ticks.map((t) => t.headroomTokens)),
        line("decode in flight", x, ticks.map((t) => t.headroomFlight)),
        line("learned (1) or cold start (0)", x, ticks.map((t) => (t.sla && t.headroomTokens !== null ? (t.headroomLearned ? 1 : 0) : null)), { dash: "dot", shape: "hv", data: false }),
      ], slaTicks ? "no forecast yet (no traffic in the level window)" : noSla);
      this.draw("scale", [
        line("prefill scale", x, ticks.map((t) => t.scale.prefill ?? null), { colour: COLOURS.prefill }),
        line("decode scale", x, ticks.map((t) => t.scale.decode ?? null), { colour: COLOURS.decode }),
        line("prefill capacity correction", x, ticks.map((t) => t.correction), { dash: "dash" }),
      ], noSla);
      this.draw("lead", [
        line("lead", x, ticks.map((t) => t.lead), { shape: "hv" }),
        {
          type: "scatter", mode: "markers", name: "measured",
          x: ticks.filter((t) => t.leadMeasured && t.lead !== null).map((t) => t.t),
          y: ticks.filter((t) => t.leadMeasured && t.lead !== null).map((t) => t.lead),
          marker: { size: 4, color: "#2ca02c" },
        },
      ], noSla);
      this.renderDecisions();
    }

    draw(id, traces, why) {
      const div = this.charts[id];
      const spec = [SHADOW_CHART, ...CHARTS].find((c) => c.id === id);
      const points = traces.filter((t) => t.meta !== "reference" && t.meta !== "flag")
        .reduce((n, t) => n + (t.y || []).filter((v) => num(v) !== null).length, 0);
      div.dataset.points = String(points);
      const layout = {
        title: { text: spec.title, font: { size: 13 }, x: 0.01, xanchor: "left" },
        margin: { l: 55, r: 10, t: 32, b: 32 },
        xaxis: { type: "date" },
        yaxis: spec.log
          // A label per decade; the digits between are unlabelled minor ticks (Plotly's default
          // labels them "2" and "5", which read as values).
          ? { title: { text: spec.y }, type: "log", dtick: 1, minor: { dtick: "D1", ticks: "outside", showgrid: true } }
          : { title: { text: spec.y }, type: "linear", rangemode: "tozero" },
        legend: { orientation: "h", y: -0.18, font: { size: 10 } },
        showlegend: true,
        template: "plotly_white",
        annotations: points ? [] : [{
          text: "no data: " + why, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
          showarrow: false, font: { size: 13, color: "#777" },
        }],
        uirevision: id, // zoom and hidden traces survive the refresh
      };
      div.dataset.empty = points ? "" : why;
      Plotly.react(div, traces, layout, { displaylogo: false, responsive: true });
    }

    renderCost() {
      const c = this.costReport;
      if (!c || !c.ticks) {
        this.cost.textContent = "cost: no ticks yet";
        return;
      }
      const f = (v, d = 2) => (v === null || v === undefined ? "–" : v.toFixed(d));
      const pct = (v) => (v === null || v === undefined ? "unknown" : (100 * v).toFixed(0) + "%");
      const roles = Object.entries(c.gpu_hours).map(([r, h]) => `${r} ${f(h)}`).join(", ");
      const hour = c.per_hour.length ? c.per_hour[c.per_hour.length - 1] : null;
      this.cost.dataset.cost = String(c.cost);
      this.cost.textContent =
        `cost over the ticks shown: ${f(c.cost)} at ${c.cost_per_gpu_hour} per GPU-hour (${f(c.gpu_hours_total)} GPU-hours: ${roles})` +
        (hour ? `; this hour ${f(hour.cost)}` : "") +
        `; idle ${pct(c.idle_share)}; static at the peak (${fmtCounts(c.peak_engines)}) ${f(c.static_cost)}, saving ${f(c.saving)} (${pct(c.saving_share)})`;
    }

    renderShadow() {
      const s = this.shadowReport;
      if (!s || !s.ticks) {
        this.shadow.textContent = "shadow mode: " + ((s && s.note) || "no shadow tick yet");
        return;
      }
      const pct = (v) => (v === null || v === undefined ? "unknown" : (100 * v).toFixed(0) + "%");
      const f = (v) => (v === null || v === undefined ? "–" : v.toFixed(2));
      const attainment = (side) => Object.entries(side.mean_predicted_attainment)
        .map(([r, v]) => `${r} ${pct(v)}`).join(", ");
      this.shadow.dataset.agreement = String(s.agreement_exact);
      this.shadow.textContent =
        `shadow mode over the last ${s.window_s} s (${s.ticks} ticks, ${s.compared} compared): ` +
        `the planner agreed with the incumbent exactly ${pct(s.agreement_exact)}, within one engine ${pct(s.agreement_within_one)}; ` +
        `GPU-hours incumbent ${f(s.incumbent.gpu_hours_total)} (cost ${f(s.incumbent.cost)}), planner ${f(s.planner.gpu_hours_total)} (cost ${f(s.planner.cost)}); ` +
        `predicted attainment incumbent ${attainment(s.incumbent)}, planner ${attainment(s.planner)} (${s.caveat})`;
    }

    renderDecisions() {
      const rows = [...this.decisions.values()].sort((a, b) => b.id - a.id).slice(0, 10);
      this.table.innerHTML = "";
      const head = this.table.insertRow();
      for (const h of ["decision", "created", "source", "replicas", "status", "reasons"]) {
        const th = document.createElement("th");
        th.textContent = h;
        head.appendChild(th);
      }
      if (!rows.length) {
        const cell = this.table.insertRow().insertCell();
        cell.colSpan = 6;
        cell.className = "empty";
        cell.textContent = "no decision yet";
        return;
      }
      for (const d of rows) {
        const tr = this.table.insertRow();
        tr.dataset.decision = d.id;
        const cells = [
          "#" + d.id, d.created_at.replace("T", " ").replace(/(\.\d+)?Z$/, ""), d.source, fmtCounts(replicasOf(d)),
          d.status + (d.status_reason ? " (" + d.status_reason + ")" : ""), (d.reasons || []).join("; "),
        ];
        cells.forEach((text, i) => {
          const td = tr.insertCell();
          td.textContent = text;
          if (i === 5) td.className = "reasons";
        });
      }
    }
  }

  // The roles whose last order did not become ready within the wait bound.
  function unavailableText(byRole) {
    return Object.entries(byRole)
      .map(([role, u]) => `${role}: ${u.ready} of ${u.asked} came, asks again in ${Math.round(u.retry_in_s)} s`)
      .join("; ");
  }

  // --- the fleet ---------------------------------------------------------------------------------

  function fleetText(m) {
    const roles = Object.entries(m.roles).map(([r, g]) => `${r} ${g.granted} of ${g.wish}`).join(", ");
    return `${roles} (${m.granted_gpus} of ${m.wish_gpus} GPUs wished)` + (m.cut ? ": CUT, " + cutText(m) : "");
  }

  function cutText(m) {
    const reasons = Object.entries(m.roles).filter(([, g]) => g.cut).map(([r, g]) => `${r} ${g.reason}`);
    const by = (m.cut_by || []).map((c) => `${c.by} (${c.why}, ${c.gpus} GPUs)`);
    return reasons.join(", ") + (by.length ? "; cut by " + by.join(", ") : "");
  }

  function fillTable(table, headings, rows, empty) {
    table.innerHTML = "";
    const head = table.insertRow();
    for (const h of headings) {
      const th = document.createElement("th");
      th.textContent = h;
      head.appendChild(th);
    }
    if (!rows.length) {
      const cell = table.insertRow().insertCell();
      cell.colSpan = headings.length;
      cell.className = "empty";
      cell.textContent = empty;
    }
    return rows.map((cells) => {
      const tr = table.insertRow();
      for (const text of cells) tr.insertCell().textContent = text;
      return tr;
    });
  }

  function renderFleet(fleet) {
    const section = document.getElementById("fleet");
    section.hidden = false;
    const budgets = fleet.budgets.map((b) =>
      `${b.gpu_type}: budget ${b.budget_gpus} GPUs, granted ${b.granted_gpus}, used ${b.used_gpus}, free ${b.free_gpus}`);
    document.getElementById("fleet-budgets").textContent =
      budgets.join("; ") + (fleet.stepped_at ? `; last step ${fleet.stepped_at}` : "; no fleet step yet") +
      (fleet.last_error ? `; last step failed: ${fleet.last_error}` : "");
    const rows = fleet.members.map((m) => [
      m.deployment, String(m.priority), fmtCounts(Object.fromEntries(Object.entries(m.roles).map(([r, g]) => [r, g.wish]))),
      fmtCounts(Object.fromEntries(Object.entries(m.roles).map(([r, g]) => [r, g.granted]))),
      `${m.wish_gpus} / ${m.granted_gpus} / ${m.used_gpus ?? "–"}`, m.cut ? "cut" : "no",
      Object.entries(m.roles).map(([r, g]) => `${r} ${g.reason}: ${g.detail}`).join("; "),
      (m.cut_by || []).map((c) => `${c.by}: ${c.why}`).join("; ") || "–",
    ]);
    const trs = fillTable(document.getElementById("fleet-members"),
      ["deployment", "priority", "wish", "grant", "GPUs wished / granted / used", "cut", "reasons", "cut by"],
      rows, "no grant yet");
    trs.forEach((tr, i) => {
      tr.dataset.deployment = fleet.members[i].deployment;
      tr.dataset.cut = fleet.members[i].cut ? "1" : "0";
      if (fleet.members[i].cut) tr.className = "cut";
    });
    const moves = fleet.moves.slice(-10).reverse().map((m) => [
      m.at.replace("T", " ").replace(/(\.\d+)?(Z|\+00:00)$/, ""), `${m.donor} ${m.donor_role} -> ${m.taker} ${m.taker_role}`,
      String(m.gpus), m.reason,
    ]);
    fillTable(document.getElementById("fleet-moves"), ["moved at", "from -> to", "GPUs", "why"], moves,
      "no GPUs moved between deployments yet");
  }

  async function pollFleet() {
    const resp = await fetch("fleet", { headers: headers(), cache: "no-store" });
    if (resp.status === 404) return; // no fleet: section in the deployments file
    if (resp.status === 401 || resp.status === 403) throw new AuthError(resp.statusText);
    if (!resp.ok) throw new Error("fleet answered " + resp.status);
    renderFleet(await resp.json());
  }

  function replicasOf(d) {
    const out = {};
    for (const role of ROLES) if (d["num_" + role] !== null && d["num_" + role] !== undefined) out[role] = d["num_" + role];
    return out;
  }

  function fmtCounts(c) {
    return Object.entries(c).map(([k, v]) => k + " " + v).join(", ") || "–";
  }

  function decisionText(d, id) {
    if (!d) return "decision #" + id;
    const reasons = (d.reasons || []).slice(0, 2).join("<br>");
    return `decision #${d.id} (${d.source}, ${d.status}): ${escapeHtml(fmtCounts(replicasOf(d)))}<br>${escapeHtml(reasons)}`;
  }

  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

  function line(name, x, y, opts = {}) {
    return {
      type: "scatter", mode: "lines", name, x, y, connectgaps: false,
      line: { color: opts.colour, dash: opts.dash || "solid", shape: opts.shape || "linear", width: opts.width || 1.6 },
      meta: opts.data === false ? "flag" : undefined,
    };
  }

  function target(name, x0, x1, value) {
    return {
      type: "scatter", mode: "lines", name, x: x0 ? [x0, x1] : [], y: x0 ? [value, value] : [],
      line: { color: "black", dash: "dash", width: 1 }, meta: "reference",
    };
  }

  // --- the page -------------------------------------------------------------------------------------

  const views = new Map();
  let clockShown = false;
  let since = null; // the first ticks loaded: window_s before the planner's time at page load

  async function refresh() {
    const status = document.getElementById("status");
    try {
      if (!clockShown) {
        const clock = await getJson("dashboard/clock");
        const info = clock.clock || {};
        document.getElementById("clock").textContent =
          info.kind === "wall" ? "times: UTC wall clock" : "times: " + (info.detail || info.kind);
        clockShown = true;
        since = new Date(Date.parse(clock.now) - WINDOW_S * 1000).toISOString();
      }
      const deployments = await getJson("deployments");
      await pollFleet();
      for (const info of deployments) {
        if (!views.has(info.name)) views.set(info.name, new DeploymentView(info, since));
        await views.get(info.name).poll(info);
      }
      const ticks = [...views.values()].reduce((n, v) => n + v.ticks.length, 0);
      status.className = "status";
      status.textContent = `${views.size} deployment(s), ${ticks} ticks; updated ${new Date().toLocaleTimeString()}, every ${REFRESH_MS / 1000} s`;
      document.getElementById("auth").hidden = !sessionStorage.getItem(TOKEN_KEY);
      document.body.dataset.state = "ready";
      document.body.dataset.ticks = String(ticks);
    } catch (err) {
      status.className = "status error";
      if (err instanceof AuthError) {
        status.textContent = "the API needs a viewer token: " + err.message;
        askForToken("");
        document.body.dataset.state = "auth";
      } else {
        status.textContent = "could not update: " + err.message + " (trying again)";
        document.body.dataset.state = document.body.dataset.state === "ready" ? "ready" : "error";
      }
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }

  document.getElementById("auth").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = document.getElementById("token").value.trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
    document.getElementById("auth-message").textContent = token ? "saved for this tab" : "cleared";
    clockShown = false;
  });

  takeTokenFromFragment();
  refresh();
})();
