/* Pure helpers of the fleet page (no DOM): grouping, tile sizing, colours, formatting.
   The Playwright tests call them directly (window.GF) for 400 and 4,000 GPUs. */
(function (root) {
  "use strict";
  var natural = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });

  /* nodes -> [{name, leaves: [{name, nodes: [...]}]}], racks and leaves in natural order */
  function group(nodes) {
    var racks = new Map();
    nodes.forEach(function (n) {
      if (!racks.has(n.rack)) racks.set(n.rack, new Map());
      var leaves = racks.get(n.rack);
      if (!leaves.has(n.leaf)) leaves.set(n.leaf, []);
      leaves.get(n.leaf).push(n);
    });
    return Array.from(racks.keys()).sort(natural.compare).map(function (r) {
      var leaves = racks.get(r);
      return {
        name: r,
        leaves: Array.from(leaves.keys()).sort(natural.compare).map(function (l) {
          return { name: l, nodes: leaves.get(l).slice().sort(function (a, b) { return natural.compare(a.name, b.name); }) };
        }),
      };
    });
  }

  /* Tile size so the whole fleet fits in about one screen: the area per GPU shrinks with
     the fleet, within 6..16 px (below 6 px a tile is not readable or clickable). */
  function layout(totalGpus, gpusPerNode, width, height) {
    var w = Math.max(320, width || 1200), h = Math.max(300, height || 700);
    var per = Math.sqrt((w * h * 0.28) / Math.max(1, totalGpus));
    var tile = Math.max(6, Math.min(16, Math.floor(per)));
    var gap = tile >= 10 ? 2 : 1;
    var gcols = gpusPerNode <= 4 ? gpusPerNode : Math.ceil(gpusPerNode / 2);
    return { tile: tile, gap: gap, gcols: Math.max(1, gcols), compact: tile < 10 };
  }

  /* utilisation 0..100 -> colour on a light-to-deep blue ramp (colour-blind safe, the
     legend uses the same stops); 0 or null -> idle grey */
  var STOPS = [[199, 233, 241], [95, 180, 201], [43, 123, 171], [35, 70, 143], [27, 29, 94]];
  function utilColor(u) {
    if (u === null || u === undefined || u <= 0) return null;
    var x = Math.min(1, u / 100) * (STOPS.length - 1), i = Math.min(STOPS.length - 2, Math.floor(x)), f = x - i;
    var a = STOPS[i], b = STOPS[i + 1];
    return "rgb(" + [0, 1, 2].map(function (k) { return Math.round(a[k] + (b[k] - a[k]) * f); }).join(",") + ")";
  }

  function ago(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
    var s = Math.abs(seconds);
    if (s < 60) return Math.round(s) + " s";
    if (s < 3600) return Math.round(s / 60) + " min";
    if (s < 86400) return (s / 3600).toFixed(s < 36000 ? 1 : 0) + " h";
    return (s / 86400).toFixed(1) + " d";
  }

  function waitCode(reason) {
    var m = /^([A-Za-z]+)[:\s]?/.exec(reason || "");
    return m ? m[1] : "";
  }

  /* The usage and cost section's rows: GET /v1/usage?by=team (this month; the server keeps
     a plain user to their own teams) joined with the budgets of GET /v1/teams. Admins also
     get budgeted teams without usage yet; anyone else gets their own teams (me.teams) and
     no other team's budget. Sorted by cost, then GPU-hours, then name. */
  function teamUsage(usage, teams, me) {
    var admin = me.role === "admin", mine = new Set(me.teams || []);
    var budget = new Map((teams || []).map(function (t) { return [t.name, t]; }));
    var rows = new Map();
    function add(name, r) {
      var b = budget.get(name) || {}, cost = r ? r.cost : 0;
      var soft = b.budget_soft === undefined ? null : b.budget_soft, hard = b.budget_hard === undefined ? null : b.budget_hard;
      var status = "";
      if (hard !== null && cost >= hard) status = "held";
      else if (hard !== null && cost >= 0.9 * hard) status = "near limit";
      else if (soft !== null && cost >= soft) status = "over soft";
      else if (soft !== null || hard !== null) status = "ok";
      rows.set(name, {
        team: name, jobs: r ? r.jobs : 0, gpu_hours: r ? r.gpu_hours : 0, cost: cost,
        energy_kwh: r ? r.energy_kwh : 0, avg_util_pct: r ? r.avg_util_pct : null,
        idle_gpu_hours: r ? r.idle_gpu_hours : 0, soft: soft, hard: hard, status: status,
      });
    }
    (usage.rows || []).forEach(function (r) { add(r.key, r); });
    (teams || []).forEach(function (t) {
      if (rows.has(t.name)) return;
      if (admin ? (t.budget_soft !== null && t.budget_soft !== undefined) || (t.budget_hard !== null && t.budget_hard !== undefined)
                : mine.has(t.name)) add(t.name, null);
    });
    return Array.from(rows.values()).sort(function (a, b) {
      return b.cost - a.cost || b.gpu_hours - a.gpu_hours || natural.compare(a.team, b.team);
    });
  }

  function money(x) { return x === null || x === undefined ? "–" : x.toLocaleString("en", { minimumFractionDigits: 2, maximumFractionDigits: 2 }); }

  root.GF = { group: group, layout: layout, utilColor: utilColor, ago: ago, waitCode: waitCode,
              teamUsage: teamUsage, money: money };
})(window);
