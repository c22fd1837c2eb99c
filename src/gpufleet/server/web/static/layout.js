/* Pure helpers of the fleet page (no DOM): grouping, tile sizing, colours, formatting,
   what needs attention, hostlists, job counts, service replicas. The Playwright tests call them directly
   (window.GF), table-driven. */
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
    var t = tileStyle(Math.max(6, Math.min(16, Math.floor(per))));
    var gcols = gpusPerNode <= 4 ? gpusPerNode : Math.ceil(gpusPerNode / 2);
    return { tile: t.tile, gap: t.gap, gcols: Math.max(1, gcols), compact: t.compact };
  }
  /* a tile size's gap, and whether the heatmap goes compact (no node labels) */
  function tileStyle(tile) { return { tile: tile, gap: tile >= 10 ? 2 : 1, compact: tile < 10 }; }

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

  /* -- attention: one definition for the header, the heatmap's labels and the panel ----
     A node that is NotReady or cordoned needs attention as a whole (all its GPUs are out
     of service) and counts once, as a node. On the other nodes each GPU that is cordoned
     (bit 4), in error (2) or hot (1) counts, once, as a GPU. Flag bits as the snapshot's. */
  var HOT = 1, ERROR = 2, CORDONED = 4;
  function nodeAttention(n) {
    if (!n.ready || n.cordoned) return { whole: true, gpus: [] };
    return { whole: false, gpus: n.gpus.filter(function (g) { return g[5] & (HOT | ERROR | CORDONED); }) };
  }
  function attention(nodes) {
    var a = { nodes: 0, notReady: 0, cordonedNodes: 0, gpus: 0, cordoned: 0, error: 0, hot: 0 };
    nodes.forEach(function (n) {
      var x = nodeAttention(n);
      if (x.whole) { a.nodes++; if (!n.ready) a.notReady++; if (n.cordoned) a.cordonedNodes++; return; }
      x.gpus.forEach(function (g) {
        a.gpus++;
        if (g[5] & CORDONED) a.cordoned++;
        if (g[5] & ERROR) a.error++;
        if (g[5] & HOT) a.hot++;
      });
    });
    return a;
  }
  function plural(n, one) { return n + " " + one + (n === 1 ? "" : "s"); }
  /* "2 nodes · 1 GPU", "3 GPUs", "none" */
  function attentionText(a) {
    var parts = [];
    if (a.nodes) parts.push(plural(a.nodes, "node"));
    if (a.gpus) parts.push(plural(a.gpus, "GPU"));
    return parts.length ? parts.join(" · ") : "none";
  }

  /* -- where a job runs, in Slurm's hostlist style ---------------------------------------
     ranges([0,1,2,3,5]) -> "0-3,5". hostlist(["node-001", "node-002", "node-004"]) ->
     "node-[001-002,004]": names grouped by the text before their trailing number, a run
     of consecutive numbers written "a-b" in the run's first number's width, so the list
     expands back to exactly the names given (node-9,node-10 -> node-[9-10]; node-09,
     node-010 stay apart). Names without a trailing number are listed as they are. */
  function ranges(nums) {
    var xs = Array.from(new Set(nums)).sort(function (a, b) { return a - b; }), out = [];
    for (var i = 0; i < xs.length; i++) {
      var j = i;
      while (j + 1 < xs.length && xs[j + 1] === xs[j] + 1) j++;
      out.push(j > i ? xs[i] + "-" + xs[j] : String(xs[i]));
      i = j;
    }
    return out.join(",");
  }
  function pad(n, width) { var s = String(n); while (s.length < width) s = "0" + s; return s; }
  function hostlist(names) {
    var groups = new Map(), plain = [];
    Array.from(new Set(names)).forEach(function (name) {
      var m = /^(.*?)(\d+)$/.exec(name);
      if (!m) { plain.push(name); return; }
      if (!groups.has(m[1])) groups.set(m[1], []);
      groups.get(m[1]).push(m[2]);
    });
    var out = [];
    Array.from(groups.keys()).sort(natural.compare).forEach(function (prefix) {
      var digits = groups.get(prefix).sort(function (a, b) { return +a - +b || a.length - b.length; }), runs = [];
      for (var i = 0; i < digits.length; i++) {
        // a run pads to its first number's width when that one is zero-padded
        var width = digits[i].length > 1 && digits[i][0] === "0" ? digits[i].length : 1, j = i;
        while (j + 1 < digits.length && +digits[j + 1] === +digits[j] + 1 && pad(+digits[j + 1], width) === digits[j + 1]) j++;
        runs.push(j > i ? digits[i] + "-" + digits[j] : digits[i]);
        i = j;
      }
      out.push(runs.length === 1 && runs[0].indexOf("-") < 0 ? prefix + runs[0] : prefix + "[" + runs.join(",") + "]");
    });
    return out.concat(plain.sort(natural.compare)).join(",");
  }
  /* A job's allocation ([{node, gpus: [index...]}]) as {text, detail, nodes}: text is short
     ("node-004 · GPU 0-3", "node-[001-032] · 8 GPUs each", "node-[001-003] · 2-8 GPUs
     per node"), detail has one line per node ("node-001: GPU 0-7"). */
  function where(allocation) {
    var per = new Map();
    (allocation || []).forEach(function (a) {
      if (!per.has(a.node)) per.set(a.node, []);
      per.set(a.node, per.get(a.node).concat(a.gpus || []));
    });
    var nodes = Array.from(per.keys()).sort(natural.compare);
    if (!nodes.length) return { text: "–", detail: "", nodes: 0 };
    var gpuText = function (g) { return g.length ? (g.length === 1 ? "GPU " : "GPUs ") + ranges(g) : "no GPUs"; };
    var detail = nodes.map(function (n) { return n + ": " + gpuText(per.get(n)); }).join("\n");
    if (nodes.length === 1) return { text: nodes[0] + " · " + gpuText(per.get(nodes[0])), detail: detail, nodes: 1 };
    var counts = nodes.map(function (n) { return new Set(per.get(n)).size; });
    var lo = Math.min.apply(null, counts), hi = Math.max.apply(null, counts);
    var each = lo === hi ? plural(lo, "GPU") + " each" : lo + "-" + hi + " GPUs per node";
    return { text: hostlist(nodes) + " · " + each, detail: detail, nodes: nodes.length };
  }

  /* -- the running jobs: one count for the header and the Running card ------------------
     "Running" = RUNNING or SCHEDULED (placed, starting): the jobs that hold GPUs. From one
     page of GET /v1/jobs?state=RUNNING,SCHEDULED (scoped by the server: an operator's is
     every job, anyone else's their own). text: the total, "200+" when the page was cut. */
  function jobCounts(page) {
    var items = page.items || [], starting = 0;
    items.forEach(function (j) { if (j.state === "SCHEDULED") starting++; });
    var total = page.total !== null && page.total !== undefined ? page.total : items.length;
    var more = total > items.length || (page.next_cursor !== null && page.next_cursor !== undefined);
    return { total: total, shown: items.length, starting: starting, more: more,
             text: String(total) + (more && total === items.length ? "+" : "") };
  }

  /* -- inference services (GET /v1/fleet/services) --------------------------------------
     A replica is draining (leaving the gateway), warm (a standby: started, out of
     rotation), ready (taking traffic), pending (waiting for GPUs: PENDING or HELD) or
     starting (placed, its health probe not yet answered). */
  function replicaState(r) {
    if (r.draining) return "draining";
    if (r.warm) return "warm";
    if (r.ready) return "ready";
    return r.state === "PENDING" || r.state === "HELD" ? "pending" : "starting";
  }
  /* where a replica runs: "node-003:0-1" (its GPUs on each node), "node-003" (CPU-only),
     "–" while it waits */
  function replicaWhere(r) {
    var a = r.allocation || [];
    if (!a.length) return "–";
    return a.map(function (x) { return x.gpus && x.gpus.length ? x.node + ":" + ranges(x.gpus) : x.node; }).join(" ");
  }
  /* a service's ready/desired badge: ok (all ready), partial, down (none of those wanted
     ready), idle (scaled to 0), deleting */
  function serviceHealth(s) {
    if (s.state === "deleting") return "deleting";
    if (s.replicas_desired === 0) return "idle";
    if (s.replicas_ready >= s.replicas_desired) return "ok";
    return s.replicas_ready > 0 ? "partial" : "down";
  }

  /* a service's traffic (ServiceTraffic, or null before any gateway report) as short
     texts: QPS, P99 (ms; slow: above the service's SLO) and the 5xx share */
  function trafficText(t, sloMs) {
    if (!t) return null;
    var num = function (x) { return x >= 100 ? Math.round(x).toLocaleString("en") : x.toFixed(x >= 10 ? 1 : 2); };
    return { qps: num(t.qps) + " qps",
             p99: t.p99_ms === null ? "p99 –" : "p99 " + num(t.p99_ms) + " ms",
             slow: t.p99_ms !== null && sloMs !== null && sloMs !== undefined && t.p99_ms > sloMs,
             errors: (t.error_rate * 100).toFixed(t.error_rate >= 0.1 ? 0 : 1) + " % 5xx",
             failing: t.error_rate > 0.01 };
  }
  /* "2 / 3 ready · 1 warm": ready of desired, and the standbys when there are any */
  function readyText(s) {
    return s.replicas_ready + " / " + s.replicas_desired + " ready" + (s.replicas_warm ? " · " + s.replicas_warm + " warm" : "");
  }

  function money(x) { return x === null || x === undefined ? "–" : x.toLocaleString("en", { minimumFractionDigits: 2, maximumFractionDigits: 2 }); }

  root.GF = { group: group, layout: layout, tileStyle: tileStyle, utilColor: utilColor, ago: ago, waitCode: waitCode,
              teamUsage: teamUsage, money: money, nodeAttention: nodeAttention, attention: attention,
              attentionText: attentionText, ranges: ranges, hostlist: hostlist, where: where,
              jobCounts: jobCounts, plural: plural, replicaState: replicaState, replicaWhere: replicaWhere,
              serviceHealth: serviceHealth, trafficText: trafficText, readyText: readyText };
})(window);
