/* The fleet page: sign in with a token, then poll the JSON API every few seconds.
   All text goes in through textContent (never innerHTML): job names are user input. */
(function () {
  "use strict";
  var GF = window.GF;
  var POLL_MS = 3000, SLOW_MS = 15000, KEY = "gpufleet.token", KEY_ID = "gpufleet.session";
  var S = { token: null, me: null, snap: null, key: "", nodeEls: new Map(), selected: null,
            svcJobs: new Map(), timer: null, slowTimer: null, lastSlow: 0, busy: false };
  var $ = function (id) { return document.getElementById(id); };

  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) {
      var v = attrs[k];
      if (v === null || v === undefined || v === false) return;
      if (k === "text") e.textContent = v;
      else if (k === "class") e.className = v;
      else if (k === "style") e.setAttribute("style", v);
      else if (k.slice(0, 2) === "on") e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    });
    (kids || []).forEach(function (c) { if (c !== null && c !== undefined) e.append(c); });
    return e;
  }
  var SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    return e;
  }

  // -- API ------------------------------------------------------------------------------
  function api(path) {
    return fetch(path, { headers: { Authorization: "Bearer " + S.token, Accept: "application/json" } })
      .then(function (r) {
        if (r.status === 401) { var e = new Error("unauthorized"); e.status = 401; throw e; }
        if (!r.ok) { return r.json().catch(function () { return {}; }).then(function (b) {
          var e = new Error(b.detail || ("HTTP " + r.status)); e.status = r.status; throw e; }); }
        return r.json();
      });
  }
  // Every item of a paged list ({items, next_cursor}: /v1/teams, /v1/reservations...).
  function apiAll(path, items) {
    items = items || [];
    return api(path).then(function (page) {
      if (Array.isArray(page)) return items.concat(page);
      items = items.concat(page.items || []);
      if (!page.next_cursor) return items;
      var base = path.replace(/([?&])cursor=[^&]*&?/, "$1").replace(/[?&]$/, "");
      var sep = base.indexOf("?") < 0 ? "?" : "&";
      return apiAll(base + sep + "cursor=" + encodeURIComponent(page.next_cursor), items);
    });
  }

  // -- session --------------------------------------------------------------------------
  // The pasted API token is traded for a web session (POST /v1/sessions: 12 h by default,
  // never past the API token's own expiry); only the session is kept, in this tab.
  function startSession(apiToken) {
    return fetch("/v1/sessions", { method: "POST", headers: { Authorization: "Bearer " + apiToken, Accept: "application/json" } })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (b) {
          if (!r.ok) { var e = new Error(b.detail || ("HTTP " + r.status)); e.status = r.status; throw e; }
          return signIn(b.token, String(b.id));
        });
      });
  }
  function endSession() {
    var id = sessionStorage.getItem(KEY_ID);
    if (S.token && id) fetch("/v1/tokens/" + encodeURIComponent(id), { method: "DELETE", headers: { Authorization: "Bearer " + S.token } }).catch(function () {});
  }
  function signIn(token, id) {
    S.token = token;
    return api("/v1/users/me").then(function (me) {
      S.me = me;
      sessionStorage.setItem(KEY, token);
      if (id) sessionStorage.setItem(KEY_ID, id);
      $("login").hidden = true; $("app").hidden = false; $("kpis").hidden = false; $("session").hidden = false;
      renderWho(me);
      tick(); slowTick();
      S.timer = setInterval(tick, POLL_MS);
      S.slowTimer = setInterval(slowTick, SLOW_MS);
    });
  }
  function signOut(message) {
    clearInterval(S.timer); clearInterval(S.slowTimer);
    sessionStorage.removeItem(KEY); sessionStorage.removeItem(KEY_ID);
    S.token = null; S.me = null; S.key = ""; S.selected = null; S.nodeEls.clear(); S.svcJobs = new Map();
    $("services").replaceChildren();
    $("heatmap").replaceChildren();
    $("app").hidden = true; $("kpis").hidden = true; $("session").hidden = true; $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("token").value = ""; $("token").focus();
  }

  // -- polling --------------------------------------------------------------------------
  function live(ok, text) { var l = $("live"); l.className = "live " + (ok ? "ok" : "bad"); l.textContent = text; }
  function fail(err) {
    if (err && err.status === 401) { signOut("Your session ended (expired or revoked). Sign in again."); return; }
    live(false, "connection problem: " + (err && err.message ? err.message : "unknown"));
  }
  function tick() {
    if (!S.token || S.busy) return;
    S.busy = true;
    Promise.all([
      api("/v1/fleet/snapshot"),
      api("/v1/jobs?state=PENDING&limit=200"),
      api("/v1/jobs?state=RUNNING,SCHEDULED&limit=200"),
      api("/v1/fleet/services"),
    ]).then(function (r) {
      S.snap = r[0];
      renderServices(r[3]);  // first: the heatmap marks the GPUs of their replicas
      renderHeatmap(r[0]); renderKpis(r[0], r[1], r[2]); renderQueue(r[1]); renderRunning(r[2]);
      if (S.selected) loadNode(S.selected, false);
      live(true, "live · " + new Date().toLocaleTimeString());
    }).catch(fail).finally(function () { S.busy = false; });
  }
  function slowTick() {
    if (!S.token) return;
    // This month per team (the server keeps a plain user to their own teams), the
    // budgets, and whether prices are set; the ledger moves every accounting tick (15 s).
    Promise.all([api("/v1/usage?by=team"), apiAll("/v1/teams"), api("/v1/prices")])
      .then(function (r) { renderUsage(r[0], r[1], r[2]); }).catch(fail);
    renderReservations();
    renderRacks();
  }

  // -- header ---------------------------------------------------------------------------
  function renderWho(me) {
    var w = $("who");
    w.replaceChildren("Signed in as ", el("strong", { text: me.name }), el("span", { class: "role", text: " (role: " + me.role + ")" }));
    w.title = "Signed in as user " + me.name + ", with the " + me.role + " role";
  }
  function operator() { return S.me !== null && (S.me.role === "admin" || S.me.role === "operator"); }
  // GPUs and attention from the snapshot (as the heatmap); the job counts from the same
  // poll's job lists (as the Queue and Running cards), so each number agrees with its card.
  function renderKpis(snap, queue, running) {
    var ready = 0, gpus = 0, busy = 0, sum = 0, n = 0;
    snap.nodes.forEach(function (node) {
      if (node.ready) ready++;
      node.gpus.forEach(function (g) {
        gpus++; if (g[5] & 8) busy++;
        if (g[1] !== null) { sum += g[1]; n++; }
      });
    });
    setKpi("k-nodes", ready, snap.nodes.length);
    setKpi("k-gpus", busy, gpus);
    $("k-util").textContent = n ? Math.round(sum / n) + " %" : "–";
    var yours = operator() ? "" : "Your ";
    var p = GF.jobCounts(queue), r = GF.jobCounts(running);
    $("k-pending").textContent = p.text;
    $("k-pending-label").textContent = yours ? "Your pending jobs" : "Pending jobs";
    $("k-pending").parentNode.title = (yours ? "Your" : "All") + " jobs waiting for GPUs (PENDING): the Queue below";
    $("k-running").replaceChildren.apply($("k-running"), [r.text].concat(r.starting ? [el("span", { class: "of", text: " · " + r.starting + " starting" })] : []));
    $("k-running-label").textContent = yours ? "Your running jobs" : "Running jobs";
    $("k-running").parentNode.title = (yours ? "Your" : "All") + " jobs running or starting (RUNNING or SCHEDULED: they hold their GPUs): the Running list below";
    var a = GF.attention(snap.nodes), k = $("k-attn");
    k.textContent = GF.attentionText(a); k.className = a.nodes || a.gpus ? "warn" : "";
    k.parentNode.title = "Needs attention: " + GF.plural(a.nodes, "node") + " (" + a.notReady + " NotReady, " + a.cordonedNodes +
      " cordoned) and, on the other nodes, " + GF.plural(a.gpus, "GPU") + " (" + a.cordoned + " cordoned, " + a.error + " in error, " +
      a.hot + " hot ≥ " + snap.hot_c + " °C). A node that is NotReady or cordoned counts once, as a node; on the other nodes each " +
      "GPU that is cordoned, in error or hot counts once.";
    $("gpu-count").textContent = gpus + " on " + snap.nodes.length + " nodes";
    $("hot-c").textContent = String(snap.hot_c);
  }
  function setKpi(id, a, b) { $(id).replaceChildren(String(a), el("span", { class: "of", text: " / " + b })); }

  // -- heatmap --------------------------------------------------------------------------
  function renderHeatmap(snap) {
    var key = snap.nodes.map(function (n) { return n.rack + "/" + n.leaf + "/" + n.name + ":" + n.gpus.length; }).join("|");
    if (key !== S.key) buildHeatmap(snap), (S.key = key);
    snap.nodes.forEach(updateNode);
  }
  function buildHeatmap(snap) {
    var box = $("heatmap");
    S.nodeEls.clear();
    var first = true;
    var racks = GF.group(snap.nodes).map(function (rack) {
      return el("section", { class: "rack", "aria-label": rack.name }, [
        el("h3", { text: rack.name }),
        el("div", { class: "leaves" }, rack.leaves.map(function (leaf) {
          var cols = Math.min(leaf.nodes.length, 5);
          return el("div", { class: "leaf", role: "group", "aria-label": "leaf switch " + leaf.name },
            [el("h4", { text: leaf.name }),
             el("div", { class: "leaf-nodes", style: "--cols:" + cols }, leaf.nodes.map(function (n) {
               var tiles = n.gpus.map(function () { return el("span", { class: "tile" }); });
               var b = el("button", { type: "button", class: "node", "data-node": n.name, tabindex: first ? "0" : "-1",
                                      "aria-pressed": String(S.selected === n.name),
                                      onclick: function () { select(n.name); } },
                          [el("span", { class: "nlabel", text: shortName(n.name) }),
                           el("span", { class: "tiles", "aria-hidden": "true" }, tiles)]);
               first = false;
               S.nodeEls.set(n.name, { btn: b, tiles: tiles });
               return b;
             }))]);
        })),
      ]);
    });
    box.replaceChildren.apply(box, racks);
    sizeHeatmap(snap);
  }
  /* The largest tile GF.layout allows for the fleet (about one screen high), then smaller
     while the racks would overflow the heatmap's width or fill under 75 % of it (in a
     narrow window one rack a row leaves half of it empty; a pixel less a tile puts two
     side by side). Measured, so it follows the CSS; again when the window is resized. */
  function sizeHeatmap(snap) {
    var box = $("heatmap"), total = 0, maxPer = 1;
    snap.nodes.forEach(function (n) { total += n.gpus.length; maxPer = Math.max(maxPer, n.gpus.length); });
    var width = box.clientWidth || 900;
    var L = GF.layout(total, maxPer, width, window.innerHeight * 0.75), fits = null;
    box.style.setProperty("--gcols", L.gcols);
    for (var t = L.tile; t >= 6; t--) {
      setTile(box, GF.tileStyle(t));
      var fill = rackWidth(box) / width;
      if (fill <= 1.001 && fits === null) fits = t;
      if (fill <= 1.001 && fill >= 0.75) return;
    }
    setTile(box, GF.tileStyle(fits !== null ? fits : L.tile));
  }
  function setTile(box, T) {
    box.style.setProperty("--tile", T.tile + "px");
    box.style.setProperty("--gap", T.gap + "px");
    box.classList.toggle("compact", T.compact);
  }
  function rackWidth(box) {
    var left = box.getBoundingClientRect().left, right = left;
    box.querySelectorAll(".rack").forEach(function (r) { right = Math.max(right, r.getBoundingClientRect().right); });
    return right - left;
  }
  function shortName(name) { var m = /(\d+)$/.exec(name); return m ? m[1] : name.slice(-4); }
  /* A GPU's MIG state from the snapshot (only GPUs that have one are there): its
     instances [profile, first memory slice, slices] by first slice, the layout pending. */
  function migOf(node, index) {
    var m = (node.mig || {})[index], p = (node.mig_pending || {})[index];
    return m === undefined && p === undefined ? null : { slices: m || null, pending: p === undefined ? null : p };
  }
  function migProfiles(mig, sep) { return mig.slices.map(function (x) { return x[0]; }).join(sep); }
  function migPendingText(mig, sep) { return mig.pending === "whole" ? "whole GPU" : mig.pending.split(",").join(sep); }
  // "GPU 3: MIG 2g.20gb, 2g.20gb, 3g.40gb · MIG layout 7g.80gb pending"
  function migText(index, mig) {
    var parts = [];
    if (mig.slices) parts.push("GPU " + index + ": MIG " + (mig.slices.length ? migProfiles(mig, ", ") : "(no instances)"));
    if (mig.pending !== null) parts.push((mig.slices ? "" : "GPU " + index + ": ") + "MIG layout " + migPendingText(mig, ", ") + " pending");
    return parts.join(" · ");
  }
  /* Thin cuts across a MIG GPU's tile at its instances' memory-slice boundaries (of 8),
     and a segmented bar along its foot, one segment per instance: "cut in 3" at a
     glance. Rebuilt only when the layout changes. */
  function drawMig(t, mig) {
    var slices = mig && mig.slices ? mig.slices : [], key = slices.map(function (x) { return x.join(":"); }).join("|");
    if ((t.dataset.mig || "") === key) return;
    if (key) t.dataset.mig = key; else delete t.dataset.mig;
    var cuts = {}, kids = [];
    slices.forEach(function (x) {
      [x[1], x[1] + x[2]].forEach(function (b) { if (b > 0 && b < 8) cuts[b] = true; });
      kids.push(el("i", { class: "mig-seg", style: "left:" + (x[1] / 8 * 100) + "%;width:" + (x[2] / 8 * 100) + "%" }));
    });
    Object.keys(cuts).forEach(function (b) { kids.push(el("i", { class: "mig-cut", style: "left:" + (b / 8 * 100) + "%" })); });
    t.replaceChildren.apply(t, kids);
  }
  /* A shared GPU (flag 16: it takes GPU shares, 1 % units, never a whole-GPU job): the %
     of it its jobs hold, the snapshot row's eighth number; null for any other GPU. */
  function shareOf(g) { return g[5] & 16 ? g[7] || 0 : null; }
  function shareText(index, held) { return "GPU " + index + ": shared, " + held + " % held"; }
  /* A bar along a shared GPU's foot, filled as far as its jobs hold it (a track shows the
     rest), so "shared, three quarters taken" reads at a glance. Rebuilt only on change;
     held null removes it (and nothing else: the GPU may be in MIG mode now). */
  function drawShare(t, held) {
    var key = held === null ? "" : String(held);
    if ((t.dataset.share || "") === key) return;
    t.querySelectorAll(".share-track, .share-fill").forEach(function (x) { x.remove(); });
    if (!key) { delete t.dataset.share; return; }
    t.dataset.share = key;
    t.append(el("i", { class: "share-track" }), el("i", { class: "share-fill", style: "width:" + held + "%" }));
  }
  function describeGpu(node, g) {
    var parts = [node.name + " GPU " + g[0]], mig = migOf(node, g[0]), share = shareOf(g);
    if (mig) parts[0] = node.name + " " + migText(g[0], mig);
    if (share !== null) parts[0] = node.name + " " + shareText(g[0], share);
    parts.push(g[1] === null ? "no telemetry" : Math.round(g[1]) + "% util");
    if (g[2] !== null) parts.push(Math.round(g[2]) + " °C");
    if (g[3] !== null) parts.push(Math.round(g[3] / 1024) + " / " + Math.round(g[4] / 1024) + " GiB");
    if (g[6] !== null) parts.push((share !== null ? "jobs incl. " : "job ") + g[6]);
    var svc = g[6] !== null ? S.svcJobs.get(g[6]) : undefined;
    if (svc) parts.push(svcText(svc));
    if (g[5] & 1) parts.push("HOT");
    if (g[5] & 2) parts.push("ERROR");
    if (g[5] & 4) parts.push("cordoned");
    return parts.join(" · ");
  }
  function updateNode(n) {
    var ref = S.nodeEls.get(n.name); if (!ref) return;
    var busy = 0, sum = 0, k = 0, served = 0, att = GF.nodeAttention(n), migs = [];
    n.gpus.forEach(function (g, i) {
      var t = ref.tiles[i]; if (!t) return;
      var mig = migOf(n, g[0]), share = shareOf(g);
      if (mig) migs.push(migText(g[0], mig));
      if (share !== null) migs.push(shareText(g[0], share));
      if (mig || t.dataset.mig) drawMig(t, mig);
      if (share !== null || t.dataset.share) drawShare(t, share);
      var c = GF.utilColor(g[1]);
      t.style.background = c || "";
      var cls = "tile";
      if (g[1] === null) cls += " none";
      if (g[5] & 1) cls += " hot";
      if (g[5] & 2) cls += " err";
      if (g[5] & 4) cls += " cord";
      if (g[6] !== null && S.svcJobs.has(g[6])) { cls += " svc"; served++; }
      if (mig && mig.slices) cls += " mig";
      if (mig && mig.pending !== null) cls += " mig-pending";
      if (share !== null) cls += " shared";
      if (t.className !== cls) t.className = cls;
      t.title = describeGpu(n, g);
      if (g[5] & 8) busy++;
      if (g[1] !== null) { sum += g[1]; k++; }
    });
    var state = n.ready ? "Ready" : "NotReady";
    ref.btn.classList.toggle("notready", !n.ready);
    var suspect = GF.suspectText(n);  // failure diagnosis blames the node (diagnoses.js)
    ref.btn.classList.toggle("suspect", suspect !== null);
    var label = n.name + ", " + state + (n.cordoned ? ", cordoned" : "") + ": " + busy + " of " + n.gpus.length +
      " GPUs allocated" + (served ? " (" + served + " to service replicas)" : "") +
      ", mean utilisation " + (k ? Math.round(sum / k) : 0) + "%" +
      (att.whole ? ", needs attention" : att.gpus.length ? ", " + GF.plural(att.gpus.length, "GPU") + (att.gpus.length === 1 ? " needs" : " need") + " attention" : "") +
      (migs.length ? "; " + migs.join("; ") : "") + (suspect ? "; " + suspect : "");
    ref.btn.setAttribute("aria-label", label);
    ref.btn.title = label;
  }
  function focusables() { return Array.from($("heatmap").querySelectorAll(".node")); }
  function onHeatKey(ev) {
    var list = focusables(), i = list.indexOf(document.activeElement);
    if (i < 0) return;
    var next = null;
    if (ev.key === "ArrowRight") next = list[i + 1];
    else if (ev.key === "ArrowLeft") next = list[i - 1];
    else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") next = vertical(list, i, ev.key === "ArrowDown");
    else if (ev.key === "Home") next = list[0];
    else if (ev.key === "End") next = list[list.length - 1];
    else return;
    ev.preventDefault();
    if (next) { list[i].tabIndex = -1; next.tabIndex = 0; next.focus(); }
  }
  function vertical(list, i, down) {
    var r = list[i].getBoundingClientRect(), cx = r.left + r.width / 2, best = null, bd = Infinity;
    list.forEach(function (b) {
      var q = b.getBoundingClientRect(), dy = down ? q.top - r.bottom : r.top - q.bottom;
      if (dy < -1) return;
      var d = dy * 4 + Math.abs(q.left + q.width / 2 - cx);
      if (b !== list[i] && d < bd) { bd = d; best = b; }
    });
    return best;
  }

  // -- node panel -----------------------------------------------------------------------
  function select(name) {
    S.selected = name;
    S.nodeEls.forEach(function (ref, n) { ref.btn.setAttribute("aria-pressed", String(n === name)); });
    $("node-close").hidden = false;
    var was = $("app").classList.contains("node-open");
    $("app").classList.add("node-open");
    loadNode(name, true);
    var panel = $("node-panel"), top = panel.getBoundingClientRect().top;
    if (!was && top > window.innerHeight - 80) panel.scrollIntoView({ block: "start" });  // under the heatmap: bring it up
  }
  function loadNode(name, fresh) {
    if (fresh) { $("node-title").textContent = name; $("node-body").replaceChildren(el("p", { class: "muted", text: "Loading…" })); }
    api("/v1/nodes/" + encodeURIComponent(name) + "/history").then(function (h) {
      if (S.selected === name) renderNode(h);
    }).catch(function (e) { if (e.status === 404) closeNode(); else fail(e); });
  }
  function closeNode() {
    var was = S.selected; S.selected = null;
    S.nodeEls.forEach(function (ref) { ref.btn.setAttribute("aria-pressed", "false"); });
    $("node-title").textContent = "Node"; $("node-close").hidden = true; $("app").classList.remove("node-open");
    $("node-body").replaceChildren(el("p", { class: "empty", text: "Select a node in the heatmap to see its GPUs' telemetry and jobs." }));
    var ref = was && S.nodeEls.get(was); if (ref) ref.btn.focus();
  }
  var PALETTE = ["#0d9488", "#2563eb", "#9333ea", "#db2777", "#ea580c", "#ca8a04", "#16a34a", "#475569"];
  function renderNode(h) {
    var node = S.snap && S.snap.nodes.find(function (n) { return n.name === h.node; });
    var body = [];
    if (node) {
      var gcord = Object.keys(node.cordoned_gpus || {}).length;
      body.push(el("div", { class: "node-meta" }, [
        el("span", { class: "pill " + (node.ready ? "Ready" : "NotReady"), text: node.ready ? "Ready" : "NotReady" }),
        node.cordoned ? el("span", { class: "pill cordoned", text: "cordoned" }) : null,
        gcord ? el("span", { class: "pill cordoned", text: GF.plural(gcord, "GPU") + " cordoned" }) : null,
        node.suspect ? el("span", { class: "pill suspect", text: "suspect", title: GF.suspectText(node) }) : null,
        el("span", { class: "muted small", text: node.model + " × " + node.gpus.length + " · " + node.leaf + " · " + node.rack + " · pool " + node.pool }),
      ]));
      var note = attentionNote(node);
      if (note) body.push(note);
    }
    var gcount = h.samples.length ? h.samples[h.samples.length - 1][1].length : 0;
    body.push(chart("Utilisation (%)", h, 0, 0, 100, gcount));
    body.push(chart("Temperature (°C)", h, 1, 20, 100, gcount));
    body.push(el("div", { class: "gpu-legend", "aria-hidden": "true" }, Array.from({ length: gcount }, function (_, i) {
      return el("span", { style: "--c:" + PALETTE[i % PALETTE.length], text: "GPU " + i });
    })));
    if (node) {
      body.push(table(["GPU", "Util", "Temp", "Memory", "Job", "State"], node.gpus.map(function (g) {
        return [String(g[0]), g[1] === null ? "–" : Math.round(g[1]) + " %", g[2] === null ? "–" : Math.round(g[2]) + " °C",
                g[3] === null ? "–" : (g[3] / 1024).toFixed(0) + " / " + (g[4] / 1024).toFixed(0) + " GiB",
                g[6] === null ? "" : "#" + g[6] + (S.svcJobs.has(g[6]) ? " · " + S.svcJobs.get(g[6]).service + " replica " + S.svcJobs.get(g[6]).replica : ""),
                gpuState(node, g)];
      }), [false, true, true, true, false, false], "GPUs of " + h.node));
    }
    body.push(el("h3", { class: "sub", text: "Jobs on this node" }));
    body.push(h.jobs.length ? table(["Job", "Name", "User", "GPUs here", "State"], h.jobs.map(function (j) {
      return ["#" + j.id, j.name || "(not yours)", j.user ? j.user + " · " + j.team : "", GF.ranges(j.gpus_here), j.state];
    }), null, "Jobs on " + h.node) : el("p", { class: "muted small", text: "No jobs on this node." }));
    body.push(el("h3", { class: "sub", text: "Recent failures" }), GF.failuresList(h.failures || [], h.now));
    $("node-title").textContent = h.node;
    $("node-body").replaceChildren.apply($("node-body"), body);
  }
  /* The node's part of the Attention KPI (GF.nodeAttention), each with its reason: the
     node NotReady or cordoned, else each GPU cordoned, in error or hot. */
  function attentionNote(node) {
    var att = GF.nodeAttention(node), items = [];
    var item = function (what, why) { return el("li", null, [el("strong", { text: what }), why ? ": " + why : null]); };
    if (!node.ready) items.push(item("NotReady", "its agent has not reported recently"));
    if (node.cordoned) items.push(item("Node cordoned", node.cordon_reason || "no reason given"));
    if (node.warning) items.push(item("Agent warning", node.warning));
    if (node.suspect) items.push(item(node.suspect.cordoned ? "Cordoned by failure diagnosis" : "Suspect",
      GF.suspectWhy(node)));
    var reasons = node.cordoned_gpus || {};
    node.gpus.forEach(function (g) {
      var own = reasons[g[0]];
      if (own !== undefined) items.push(item("GPU " + g[0] + " cordoned", own || "no reason given"));
      if (att.whole) return;
      if (g[5] & 4 && own === undefined) items.push(item("GPU " + g[0] + " cordoned", ""));
      if (g[5] & 2) items.push(item("GPU " + g[0] + " in error", "the agent reports it unhealthy or faulty"));
      if (g[5] & 1) items.push(item("GPU " + g[0] + " hot", (g[2] === null ? "" : Math.round(g[2]) + " °C, ") + "at or above " + S.snap.hot_c + " °C"));
    });
    if (!items.length) return null;
    var head = att.whole ? "Needs attention: the whole node" : att.gpus.length ? "Needs attention: " + GF.plural(att.gpus.length, "GPU")
      : "Needs attention: the node";  // only suspect (failure diagnosis)
    return el("div", { class: "attn", role: "note" }, [el("h3", { class: "sub", text: head }), el("ul", null, items)]);
  }
  function gpuState(node, g) {
    var out = [], mig = migOf(node, g[0]);
    // a narrow panel may break a long pill after a "·"
    var breakable = function (text) {
      return text.split("·").reduce(function (kids, x, i) { return kids.concat(i ? ["·", el("wbr"), x] : [x]); }, []);
    };
    if (mig && mig.slices) out.push(el("span", { class: "pill mig", title: migText(g[0], { slices: mig.slices, pending: null }) },
      breakable("MIG " + (mig.slices.length ? migProfiles(mig, "·") : "(no instances)"))));
    if (mig && mig.pending !== null) out.push(el("span", { class: "pill mig-pending", title: "asked for, not yet applied; " + cordonWhy(node, g[0]) },
      breakable("MIG → " + migPendingText(mig, "·") + " pending")));
    var share = shareOf(g);
    if (share !== null) out.push(el("span", { class: "pill shared", text: "shared " + share + " %",
      title: "takes GPU shares (1 % units of its compute and memory), never a whole-GPU job; its jobs hold " + share + " %" }));
    if (g[5] & 4) out.push(el("span", { class: "pill cordoned", title: cordonWhy(node, g[0]), text: "cordoned" }));
    if (g[5] & 2) out.push(el("span", { class: "pill error", text: "error" }));
    if (g[5] & 1) out.push(el("span", { class: "pill hot", text: "hot" }));
    return out.length ? el("span", { class: "states" }, out) : "";
  }
  function cordonWhy(node, index) {
    var own = (node.cordoned_gpus || {})[index];
    if (own !== undefined) return "GPU cordoned: " + (own || "no reason given");
    return node.cordoned ? "node cordoned: " + (node.cordon_reason || "no reason given") : "cordoned";
  }
  function chart(title, h, series, lo, hi, gcount) {
    var W = 360, H = 110, L = 28, R = 6, T = 6, B = 16;
    var s = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", preserveAspectRatio: "none" });
    var t0 = h.samples.length ? h.samples[0][0] : h.now - 60, t1 = Math.max(h.now, t0 + 1);
    var x = function (t) { return L + (W - L - R) * (t - t0) / (t1 - t0); };
    var y = function (v) { return T + (H - T - B) * (1 - (Math.min(hi, Math.max(lo, v)) - lo) / (hi - lo)); };
    [lo, (lo + hi) / 2, hi].forEach(function (v) {
      s.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      var tx = svg("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" }); tx.textContent = String(v); s.append(tx);
    });
    var lab = svg("text", { x: W - R, y: H - 3, "text-anchor": "end" }); lab.textContent = "now"; s.append(lab);
    var lab2 = svg("text", { x: L, y: H - 3 }); lab2.textContent = "−" + GF.ago(t1 - t0); s.append(lab2);
    var summary = [];
    for (var g = 0; g < gcount; g++) {
      var pts = [], last = null;
      h.samples.forEach(function (smp) {
        var v = smp[1][g] ? smp[1][g][series] : null;
        if (v !== null && v !== undefined) { pts.push(x(smp[0]).toFixed(1) + "," + y(v).toFixed(1)); last = v; }
      });
      if (pts.length) s.append(svg("polyline", { class: "line", points: pts.join(" "), stroke: PALETTE[g % PALETTE.length] }));
      if (last !== null) summary.push("GPU " + g + " " + Math.round(last));
    }
    s.setAttribute("aria-label", title + " over the last " + GF.ago(t1 - t0) + "; latest: " + (summary.join(", ") || "no data"));
    if (!h.samples.length) {
      var nt = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }); nt.textContent = "no telemetry yet"; s.append(nt);
    }
    return el("figure", { class: "chart" }, [el("h3", { text: title }), s]);
  }

  // -- tables ---------------------------------------------------------------------------
  function table(head, rows, numeric, caption) {
    numeric = numeric || [];
    return el("table", null, [
      caption ? el("caption", { class: "sr-only", style: "position:absolute;left:-9999px", text: caption }) : null,
      el("thead", null, [el("tr", null, head.map(function (h, i) { return el("th", { scope: "col", class: numeric[i] ? "num" : null, text: h }); }))]),
      el("tbody", null, rows.map(function (r) {
        return el("tr", null, r.map(function (c, i) {
          return el("td", { class: numeric[i] ? "num" : null }, [c instanceof Node ? c : document.createTextNode(c)]);
        }));
      })),
    ]);
  }
  function renderQueue(page) {
    var items = page.items.slice().sort(function (a, b) {
      return (a.queue_position || 1e9) - (b.queue_position || 1e9) || a.id - b.id;
    });
    var now = S.snap ? S.snap.at : Date.now() / 1000;
    $("queue-count").textContent = GF.jobCounts(page).text + " waiting";
    if (!items.length) { $("queue").replaceChildren(el("p", { class: "empty", text: "Nothing is waiting: every job has its GPUs." })); return; }
    $("queue").replaceChildren(table(["#", "Job", "User · team", "GPUs", "Waiting", "Est. start", "Why it waits"],
      items.slice(0, 100).map(function (j) {
        var code = GF.waitCode(j.wait_reason);
        var reason = el("span", { class: "reason" }, [code ? el("span", { class: "code " + code, text: code }) : null,
                           (j.wait_reason || "not yet considered").slice(code.length).replace(/^[:\s]+/, "")]);
        return [j.queue_position === null ? "–" : String(j.queue_position), "#" + j.id + " " + j.name, j.user + " · " + j.team,
                String(j.gpus), GF.ago(now - j.submit_time),
                j.estimated_start === null ? "unknown" : (j.estimated_start <= now ? "now" : "in " + GF.ago(j.estimated_start - now)),
                reason];
      }), [true, false, false, true, true, true, false], "Queue"));
  }
  function renderRunning(page) {
    var now = S.snap ? S.snap.at : Date.now() / 1000;
    var items = page.items.slice().sort(function (a, b) { return (b.started_at || 0) - (a.started_at || 0); });
    var c = GF.jobCounts(page);
    $("running-count").textContent = c.text + (c.starting ? " · " + c.starting + " starting" : "") +
      (c.more ? " (" + c.shown + " shown)" : "");
    $("running-count").title = "Jobs running or starting (RUNNING or SCHEDULED: they hold their GPUs)";
    if (!items.length) { $("running").replaceChildren(el("p", { class: "empty", text: "No jobs are running." })); return; }
    var open = new Set(Array.from($("running").querySelectorAll("details[open]")).map(function (d) { return d.dataset.job; }));
    $("running").replaceChildren(table(["Job", "User · team", "GPUs", "Where", "Running for", "Ends (predicted)", "State"],
      items.map(function (j) {
        return ["#" + j.id + " " + j.name, j.user + " · " + j.team, String(j.gpus), whereCell(j, open),
                j.started_at ? GF.ago(now - j.started_at) : "starting", predictedEnd(j, now),
                el("span", { class: "pill " + j.state, text: j.state })];
      }), [false, false, true, false, true, true, false], "Running jobs"));
  }
  // When the scheduler predicts a running job ends (issue 33: from the jobs like it that
  // ended before), with what it is based on as the tooltip; "–" without a prediction.
  function predictedEnd(j, now) {
    if (j.predicted_end === null || j.predicted_end === undefined) return "–";
    var late = now - j.predicted_end;
    return el("span", { title: "predicted from " + j.prediction_basis + ", confidence " +
                        (j.prediction_confidence || 0).toFixed(2) + " (at most its time limit)",
                        text: late > 1 ? "overdue " + GF.ago(late) : "in " + GF.ago(-late) });
  }
  // Where a job runs, short (GF.where: a hostlist); a multi-node one opens to each node's GPUs.
  function whereCell(j, open) {
    var w = GF.where(j.allocation);
    if (w.nodes <= 1) return el("span", { class: "where", title: w.detail || null, text: w.text });
    return el("details", { class: "where", "data-job": String(j.id), open: open.has(String(j.id)) }, [
      el("summary", { title: w.detail, text: w.text }),
      el("ul", { class: "where-list" }, w.detail.split("\n").map(function (line) { return el("li", { text: line }); })),
    ]);
  }
  // -- inference services --------------------------------------------------------------
  // GET /v1/fleet/services: the user's own services (an operator's: every one), each with
  // its live replicas; S.svcJobs maps their job ids for the heatmap and the node panel.
  var HEALTH = { ok: "every desired replica is ready", partial: "some replicas are not ready",
                 down: "no replica is ready", idle: "scaled to 0 replicas", deleting: "being deleted: its replicas drain" };
  function svcText(x) { return "service " + x.service + " replica " + x.replica + " (" + x.state + ")"; }
  function renderServices(list) {
    var jobs = new Map();
    list.forEach(function (s) {
      s.replicas.forEach(function (r) { jobs.set(r.job_id, { service: s.name, replica: r.replica, state: GF.replicaState(r) }); });
    });
    S.svcJobs = jobs;
    var ready = 0, desired = 0;
    list.forEach(function (s) { ready += s.replicas_ready; desired += s.replicas_desired; });
    $("svc-count").textContent = list.length ? GF.plural(list.length, "service") + " · " + ready + " / " + GF.plural(desired, "replica") + " ready" : "";
    if (!list.length) {
      $("services").replaceChildren(el("p", { class: "empty", text: (operator() ? "No inference services." : "You have no inference services.") +
        " Deploy one with gpufleet service deploy." }));
      return;
    }
    $("services").replaceChildren(table(["Service", "Ready", "Traffic", "Last hour", "Generation", "Replicas"], list.map(function (s) {
      var h = GF.serviceHealth(s);
      return [el("span", { class: "svc-name" }, [el("strong", { text: s.name }),
                el("span", { class: "muted small", text: s.owner + " · " + s.team + " · " + s.protocol })]),
              el("span", { class: "states", title: GF.readyText(s) }, [
                el("span", { class: "pill svc-" + h, title: HEALTH[h], "aria-label": s.replicas_ready + " of " + GF.plural(s.replicas_desired, "replica") + " ready: " + HEALTH[h],
                             text: s.replicas_ready + " / " + s.replicas_desired }),
                s.replicas_warm ? el("span", { class: "pill rep-warm", title: "standby replicas: started and ready, not in rotation",
                                               text: s.replicas_warm + " warm" }) : null,
                s.state === "deleting" ? el("span", { class: "pill svc-deleting", text: "deleting" }) : null]),
              trafficCell(s), svcChart(s), String(s.generation), replicasCell(s)];
    }), [false, false, false, false, true, false], "Inference services"));
  }
  function trafficCell(s) {
    var t = GF.trafficText(s.traffic, s.slo_p99_ms);
    if (!t) return el("span", { class: "muted", text: "no traffic reported" });
    return el("span", { class: "svc-traffic" }, [
      el("strong", { class: "qps", text: t.qps }),
      el("span", { class: "p99" + (t.slow ? " bad" : ""), text: t.p99,
                   title: s.slo_p99_ms ? "SLO p99 " + s.slo_p99_ms + " ms" : "no p99 objective set" }),
      el("span", { class: "err" + (t.failing ? " bad" : ""), text: t.errors })]);
  }
  // desired / ready / warm replicas (steps, left scale) and QPS (right scale) over the
  // samples the server keeps (one per 5 s, an hour), drawn like the node panel's charts
  var SVC_LINES = [["desired", 1, "#94a3b8"], ["ready", 2, "#0d9488"], ["warm", 3, "#d97706"], ["qps", 4, "#7c3aed"]];
  function svcChart(s) {
    var W = 240, H = 64, L = 18, R = 30, T = 5, B = 13, smp = s.history.samples;
    var c = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", preserveAspectRatio: "none", class: "svc-chart" });
    if (!smp.length) {
      var nt = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }); nt.textContent = "no history yet"; c.append(nt);
      c.setAttribute("aria-label", "no history yet");
      return el("figure", { class: "chart svc-fig" }, [c]);
    }
    var t1 = smp[smp.length - 1][0], t0 = Math.min(smp[0][0], t1 - 60);
    var top = 1, qtop = 0;
    smp.forEach(function (x) { top = Math.max(top, x[1], x[2], x[3]); qtop = Math.max(qtop, x[4] || 0); });
    qtop = qtop > 0 ? qtop * 1.1 : 1;
    var px = function (t) { return L + (W - L - R) * (t - t0) / (t1 - t0); };
    var py = function (v, hi) { return T + (H - T - B) * (1 - v / hi); };
    [0, top].forEach(function (v) {
      c.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: py(v, top), y2: py(v, top) }));
      var tx = svg("text", { x: L - 3, y: py(v, top) + 3, "text-anchor": "end" }); tx.textContent = String(v); c.append(tx);
    });
    if (smp.some(function (x) { return x[4] !== null; })) {  // the QPS scale, once a gateway reported
      var qx = svg("text", { x: W - R + 3, y: T + 6 }); qx.textContent = qtop >= 10 ? String(Math.round(qtop)) : qtop.toFixed(1); c.append(qx);
      var q0 = svg("text", { x: W - R + 3, y: H - B }); q0.textContent = "qps"; c.append(q0);
    }
    var ago = svg("text", { x: L, y: H - 2 }); ago.textContent = "−" + GF.ago(t1 - t0); c.append(ago);
    var nowt = svg("text", { x: W - R, y: H - 2, "text-anchor": "end" }); nowt.textContent = "now"; c.append(nowt);
    SVC_LINES.forEach(function (line) {
      var k = line[1], pts = [], prev = null;
      smp.forEach(function (x) {
        var v = x[k];
        if (v === null || v === undefined) { prev = null; return; }
        var y = k === 4 ? py(v, qtop) : py(v, top) - (k === 1 ? 0 : k === 2 ? 1 : 2);  // apart where equal
        if (prev !== null && k !== 4) pts.push(px(x[0]).toFixed(1) + "," + prev);  // steps: counts change at a sample
        prev = y.toFixed(1);
        pts.push(px(x[0]).toFixed(1) + "," + prev);
      });
      if (pts.length === 1) pts.push((W - R) + "," + pts[0].split(",")[1]);
      if (pts.length) c.append(svg("polyline", { class: "line svc-" + line[0], points: pts.join(" "), stroke: line[2] }));
    });
    var last = smp[smp.length - 1];
    c.setAttribute("aria-label", "Replicas and QPS over the last " + GF.ago(t1 - t0) + "; now " + last[1] + " desired, " +
      last[2] + " ready, " + last[3] + " warm, " + (last[4] === null ? "no" : last[4]) + " qps");
    return el("figure", { class: "chart svc-fig" }, [c]);
  }
  function replicasCell(s) {
    if (!s.replicas.length) return el("span", { class: "muted", text: "no replicas" });
    return el("ul", { class: "replicas" }, s.replicas.map(function (r) {
      var st = GF.replicaState(r), old = r.generation !== s.generation;
      var tip = "replica " + r.replica + " · job #" + r.job_id + " · generation " + r.generation + " · " + r.state +
        (r.endpoint ? " · " + r.endpoint : "");
      return el("li", { title: tip, "data-job": String(r.job_id) }, [
        el("code", { text: GF.replicaWhere(r) }), " ", el("span", { class: "pill rep-" + st, text: st }),
        old ? el("span", { class: "muted small", text: " gen " + r.generation }) : null]);
    }));
  }

  // -- usage and cost -------------------------------------------------------------------
  var STATUS = { held: "held: new jobs wait", "over soft": "soft budget reached", "near limit": "near hard budget", ok: "within budget" };
  function renderUsage(u, teams, prices) {
    var priced = prices.schedule !== null;
    var month = new Date((u.start + 3600) * 1000).toLocaleDateString("en", { month: "long", year: "numeric", timeZone: u.timezone });
    $("usage-period").textContent = month + " so far · " + u.timezone;
    var rows = GF.teamUsage(u, teams, S.me);
    var box = $("usage");
    if (!rows.length) { box.replaceChildren(el("p", { class: "empty", text: "No team has used GPUs this month yet." })); return; }
    var hours = function (x) { return x.toFixed(x < 10 ? 2 : 1); };
    var short = function (x) { return Number.isInteger(x) ? String(x) : GF.money(x); };
    var table0 = table(["Team", "Jobs", "GPU-h", "Cost", "kWh", "Util", "Idle GPU-h", "Budget"],
      rows.map(function (r) {
        var budget = r.soft === null && r.hard === null ? el("span", { class: "muted", text: "none" }) :
          el("span", { class: "budget" }, [
            el("span", { text: [r.soft !== null ? "soft " + short(r.soft) : null, r.hard !== null ? "hard " + short(r.hard) : null]
                                  .filter(Boolean).join(" · ") }), " ",
            el("span", { class: "pill budget-" + r.status.replace(" ", "-"), text: STATUS[r.status] })]);
        return [r.team, String(r.jobs), hours(r.gpu_hours), GF.money(r.cost), hours(r.energy_kwh),
                r.avg_util_pct === null ? "–" : Math.round(r.avg_util_pct) + " %", hours(r.idle_gpu_hours), budget];
      }), [false, true, true, true, true, true, true, false], "Usage and cost per team, " + month);
    table0.id = "usage-table";
    var kids = [el("div", { class: "usage-grid" }, [usageChart(rows, priced, box), el("div", { class: "table-wrap" }, [table0])])];
    if (!priced) kids.push(el("p", { class: "muted small", text: "No GPU prices are set, so every cost is 0 (an admin sets them: gpufleet admin set-prices FILE)." }));
    box.replaceChildren.apply(box, kids);
  }
  var BAR = { ok: "#0d9488", "": "#0d9488", "near limit": "#b45309", "over soft": "#b45309", held: "#b91c1c" };
  function usageChart(rows, priced, box) {
    var shown = rows.slice(0, 12), key = priced ? "cost" : "gpu_hours";
    var fmt = priced ? GF.money : function (x) { return x.toFixed(1); };
    var W = Math.max(300, Math.min(560, Math.round((box.clientWidth || 900) * 0.4))), L = 96, R = 110, RH = 28, T = 6;
    var H = T + shown.length * RH + 4;
    var max = Math.max.apply(null, shown.map(function (r) {
      return Math.max(r[key], priced && r.hard !== null ? r.hard : 0, priced && r.soft !== null ? r.soft : 0);
    }).concat([1e-9]));
    var x = function (v) { return L + (W - L - R) * Math.min(1, v / max); };
    var s = svg("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img", class: "usage-svg" });
    var said = [];
    shown.forEach(function (r, i) {
      var y = T + i * RH, mid = y + RH / 2;
      var name = svg("text", { x: L - 8, y: mid + 4, "text-anchor": "end", class: "team" });
      name.textContent = r.team.length > 13 ? r.team.slice(0, 12) + "…" : r.team; s.append(name);
      s.append(svg("rect", { x: L, y: mid - 7, width: W - L - R, height: 14, rx: 3, class: "track" }));
      var bar = svg("rect", { x: L, y: mid - 7, width: Math.max(r[key] > 0 ? 2 : 0, x(r[key]) - L), height: 14, rx: 3,
                              class: "bar", fill: priced ? BAR[r.status] : BAR.ok });
      var tip = svg("title", {}); tip.textContent = r.team + ": " + fmt(r[key]) + (priced ? "" : " GPU-hours"); bar.append(tip);
      s.append(bar);
      if (priced && r.soft !== null) s.append(svg("line", { x1: x(r.soft), x2: x(r.soft), y1: mid - 10, y2: mid + 10, class: "soft" }));
      if (priced && r.hard !== null) s.append(svg("line", { x1: x(r.hard), x2: x(r.hard), y1: mid - 10, y2: mid + 10, class: "hard" }));
      var val = svg("text", { x: W - R + 8, y: mid + 4, class: "val" });
      val.textContent = fmt(r[key]) + (priced && r.hard !== null ? " of " + fmt(r.hard) : "");
      s.append(val);
      said.push(r.team + " " + fmt(r[key]) + (priced && r.hard !== null ? " of hard budget " + fmt(r.hard) : ""));
    });
    var what = priced ? "Cost this month per team" : "GPU-hours this month per team";
    s.setAttribute("aria-label", what + ": " + said.join("; ") + (rows.length > shown.length ? "; " + (rows.length - shown.length) + " more in the table" : ""));
    var legend = priced ? el("ul", { class: "legend usage-legend", "aria-hidden": "true" }, [
      el("li", null, [el("span", { class: "sw cost" }), "cost"]),
      el("li", null, [el("span", { class: "sw soft" }), "soft budget"]),
      el("li", null, [el("span", { class: "sw hard" }), "hard budget"]),
    ]) : null;
    return el("figure", { class: "usage-chart" }, [el("h3", { text: what }), s, legend]);
  }

  // -- reservations: a calendar of the coming week, and the exact times in a table -----
  var CAL_DAYS = 7;
  function calStart(now) { var d = new Date(now * 1000); d.setHours(0, 0, 0, 0); return d.getTime() / 1000; }
  function dayLabel(t) { return new Date(t * 1000).toLocaleDateString(undefined, { weekday: "short", day: "numeric", month: "short" }); }
  function timeLabel(t) { return new Date(t * 1000).toLocaleString(undefined, { weekday: "short", day: "numeric", month: "short", hour: "2-digit", minute: "2-digit" }); }
  // a repeat's windows are named "name#1", "name#2", ...: they share one lane
  function resvBase(x) { return x.name ? x.name.replace(/#\d+$/, "") : "#" + x.id; }
  function resvLane(x) { return (x.maintenance ? "maintenance" : (x.team || x.owner)) + "\u0000" + resvBase(x); }
  function resvWhat(x) {
    var where = x.nodes && x.nodes.length ? x.nodes.map(function (n) { return n[0]; }).join(", ") : x.pool;
    return x.gpus + " GPUs" + (x.gpu_type ? " " + x.gpu_type : "") + " · " + where;
  }
  function renderCalendar(items, now) {
    var t0 = calStart(now), t1 = t0 + CAL_DAYS * 86400, span = t1 - t0;
    var pct = function (t) { return (Math.min(Math.max(t, t0), t1) - t0) / span * 100; };
    var lanes = new Map(), later = 0;
    items.forEach(function (x) {
      if (x.end <= t0) return;
      if (x.start >= t1) { later++; return; }
      var k = resvLane(x);
      if (!lanes.has(k)) lanes.set(k, []);
      lanes.get(k).push(x);
    });
    var head = el("div", { class: "cal-days", "aria-hidden": "true" }, []);
    for (var d = 0; d < CAL_DAYS; d++) {
      var at = t0 + d * 86400;
      head.append(el("span", { class: "cal-day" + (d === 0 ? " today" : ""), style: "left:" + (d / CAL_DAYS * 100) + "%", text: d === 0 ? "Today" : dayLabel(at) }));
    }
    var rows = [];
    Array.from(lanes.keys()).sort(function (a, b) { return lanes.get(a)[0].start - lanes.get(b)[0].start; }).forEach(function (k) {
      var list = lanes.get(k).sort(function (a, b) { return a.start - b.start; });
      var first = list[0];
      var who = first.maintenance ? "maintenance" : (first.team || first.owner);
      var bars = list.map(function (x) {
        var left = pct(x.start), width = Math.max(pct(x.end) - left, 0.6);
        var said = (x.name || "#" + x.id) + ", " + who + ": " + resvWhat(x) + ", " + timeLabel(x.start) + " to " + timeLabel(x.end) + ", " + x.state.toLowerCase() + (x.reason ? " (" + x.reason + ")" : "");
        return el("li", { class: "cal-bar " + x.state + (x.maintenance ? " maint" : ""), style: "left:" + left + "%;width:" + width + "%", title: said, "aria-label": said, tabindex: "0" },
          [el("span", { text: width > 7 ? x.gpus + " GPUs" : "" })]);
      });
      rows.push(el("div", { class: "cal-row" }, [
        el("div", { class: "cal-name" }, [el("strong", { text: resvBase(first) }), el("span", { class: "muted", text: who + (list.length > 1 ? " · " + list.length + " windows" : "") })]),
        el("ul", { class: "cal-lane", "aria-label": resvBase(first) + " (" + who + ")" }, bars),
      ]));
    });
    // day lines and the now line lie over the lanes' column
    var overlay = el("div", { class: "cal-overlay", "aria-hidden": "true" }, []);
    for (var g = 1; g < CAL_DAYS; g++) overlay.append(el("span", { class: "cal-line", style: "left:" + (g / CAL_DAYS * 100) + "%" }));
    overlay.append(el("span", { class: "cal-now", style: "left:" + pct(now) + "%" }));
    var body = el("div", { class: "cal-body" }, [overlay].concat(rows));
    var legend = el("ul", { class: "legend cal-legend", "aria-hidden": "true" }, [
      el("li", null, [el("span", { class: "sw cal-sw ACTIVE" }), "active"]),
      el("li", null, [el("span", { class: "sw cal-sw BOOKED" }), "booked"]),
      el("li", null, [el("span", { class: "sw cal-sw maint" }), "maintenance"]),
      el("li", null, [el("span", { class: "sw cal-sw RELEASED" }), "ended or released"]),
    ]);
    var note = later ? el("p", { class: "muted small", text: later + " more after " + dayLabel(t1 - 1) + " (in the table)." }) : null;
    return el("figure", { class: "calendar", "aria-label": "Reservations over the next " + CAL_DAYS + " days" }, [
      el("div", { class: "cal-head" }, [el("div", { class: "cal-name" }), head]), body, legend, note]);
  }
  function renderReservations() {
    var box = $("reservations");
    apiAll("/v1/reservations").then(function (r) {
      var items = r.filter(function (x) { return x.state !== "CANCELLED"; });
      var now = S.snap ? S.snap.at : Date.now() / 1000;
      var upcoming = items.filter(function (x) { return x.state === "ACTIVE" || x.state === "BOOKED"; });
      $("resv-count").textContent = upcoming.length ? upcoming.length + " active or booked" : "";
      if (!items.length) { box.replaceChildren(el("p", { class: "empty", text: "No reservations. Book GPUs ahead with gpufleet reserve." })); return; }
      items.sort(function (a, b) { return a.start - b.start; });
      var rows = items.filter(function (x) { return x.end > now - 86400; }).map(function (x) {
        return [String(x.name || "#" + x.id), x.maintenance ? "maintenance" : String(x.team || x.owner), resvWhat(x),
                timeLabel(x.start), timeLabel(x.end), el("span", { class: "pill resv-" + x.state, text: x.state.toLowerCase() })];
      });
      var was = box.querySelector("details"), open = was !== null && was.open;  // redrawn every 15 s: stay open
      box.replaceChildren(renderCalendar(items, now), el("details", { class: "resv-details", open: open }, [
        el("summary", { text: "Exact times (" + rows.length + ")" }),
        el("div", { class: "table-wrap" }, [table(["Name", "Team", "What", "From", "To", "State"], rows, null, "Reservations")]),
      ]));
    }).catch(fail);
  }

  // -- racks: each rack's estimated draw against its power budget (gpufleet admin rack) ---
  function renderRacks() {
    api("/v1/racks").then(function (r) {
      var items = r.items.filter(function (x) { return x.power_kw !== null || x.busy_gpus > 0; });
      $("rack-count").textContent = items.length ? String(items.length) : "";
      if (!items.length) { $("racks").replaceChildren(el("p", { class: "empty", text: "No rack has a power budget. Set one with gpufleet admin rack set." })); return; }
      var rows = items.map(function (x) {
        var share = x.cap_kw ? Math.min(1, x.draw_kw / x.cap_kw) : 0;
        var over = x.cap_kw !== null && x.draw_kw > x.cap_kw;
        return [x.rack, x.busy_gpus + "/" + x.gpus, x.draw_kw.toFixed(1),
                x.cap_kw === null ? "-" : x.cap_kw.toFixed(1),
                x.power_kw === null ? "no budget" : x.power_kw + " kW, " + Math.round(x.headroom * 100) + "% headroom",
                el("meter", { min: "0", max: "1", high: "0.9", value: String(share), class: over ? "over" : null,
                              "aria-label": x.rack + " draw against cap", title: Math.round(share * 100) + "% of cap" })];
      });
      $("racks").replaceChildren(table(["Rack", "Busy GPUs", "Draw kW", "Cap kW", "Feed", "Of cap"], rows,
                                      [false, true, true, true, false, false], "Rack power"));
    }).catch(fail);
  }

  // -- start ----------------------------------------------------------------------------
  document.addEventListener("DOMContentLoaded", function () {
    $("login-form").addEventListener("submit", function (ev) {
      ev.preventDefault();
      var t = $("token").value.trim();
      if (!t) { $("login-error").textContent = "Enter a token."; return; }
      $("login-error").textContent = "";
      startSession(t).catch(function (e) {
        S.token = null;
        $("login-error").textContent = e.status === 401 ? "That token was not accepted."
          : e.status ? e.message : "Cannot reach the server: " + e.message;
      });
    });
    $("logout").addEventListener("click", function () { endSession(); signOut(""); });
    $("node-close").addEventListener("click", closeNode);
    $("heatmap").addEventListener("keydown", onHeatKey);
    var resized = null;
    window.addEventListener("resize", function () {
      clearTimeout(resized);
      resized = setTimeout(function () { if (S.snap && S.key) sizeHeatmap(S.snap); }, 150);
    });
    document.addEventListener("keydown", function (ev) { if (ev.key === "Escape" && S.selected) closeNode(); });
    var saved = sessionStorage.getItem(KEY);
    if (saved) signIn(saved).catch(function () { signOut(""); });
    else $("token").focus();
  });
})();
