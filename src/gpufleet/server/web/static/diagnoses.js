/* Failure diagnosis on the fleet page (issue 34): the words for a suspect node (its tile's
   tooltip, its detail) and a node's recent failed jobs with what their output matched.
   Job names and output lines are user input: everything goes in through textContent,
   never innerHTML. Adds to window.GF (layout.js loads first); the Playwright tests call
   these directly. */
(function (root) {
  "use strict";
  var GF = root.GF;

  function hours(s) { var h = s / 3600; return (h === Math.round(h) ? String(h) : h.toFixed(1)) + " h"; }
  /* "failed jobs of 2 of 3 users within 24 h (jobs 41, 57)" from a snapshot's `suspect` */
  function evidenceText(x) {
    var users = x.threshold ? x.users + " of " + x.threshold + " users" : GF.plural(x.users, "user");
    return "failed jobs of " + users + " within " + hours(x.window_s) +
      (x.jobs.length ? " (" + (x.jobs.length === 1 ? "job " : "jobs ") + x.jobs.join(", ") + ")" : "");
  }
  /* Why the node is suspect (the detail's words): null when nobody suspects it. */
  function suspectWhy(node) {
    var x = node.suspect;
    if (!x) return null;
    return x.signature + (x.diagnosis ? " (" + x.diagnosis + ")" : "") + " in " + evidenceText(x) +
      (x.cordoned ? "; uncordon it once repaired" : x.threshold ? "; cordoned at " + x.threshold + " users" : "");
  }
  /* The tile's words: null when nobody suspects the node. */
  function suspectText(node) {
    var why = suspectWhy(node);
    return why === null ? null : (node.suspect.cordoned ? "cordoned by failure diagnosis: " : "suspect: ") + why;
  }
  var BLAME = { node: "the node", job: "the job's code", unknown: "unclear" };

  function node(tag, cls, text, kids) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== null && text !== undefined) e.textContent = text;
    (kids || []).forEach(function (k) { if (k) e.append(k); });
    return e;
  }
  /* A node's recent failures (NodeHistory.failures, newest first) as a list; `now` the
     server's clock (NodeHistory.now). */
  function failuresList(failures, now) {
    if (!failures.length) return node("p", "muted small", "No failed jobs on this node recently.");
    return node("ul", "failures", null, failures.map(function (f) {
      var head = node("div", "f-head", null, [
        node("strong", null, "#" + f.job_id),
        f.name ? node("span", "f-name", f.name) : node("span", "f-name muted", "(not yours)"),
        f.user ? node("span", "muted", f.user) : null,
        node("span", "muted", GF.ago(now - f.at) + " ago"),
        f.blame ? blamePill(f.blame) : null,
      ]);
      var kids = [head];
      if (f.pending) kids.push(node("div", "muted", "reading its output…"));
      else if (!f.signature) kids.push(node("div", "muted", "no known signature in its output"));
      else {
        kids.push(node("div", "f-diag", null, [node("code", "f-sig", f.signature), document.createTextNode(" " + (f.diagnosis || ""))]));
        if (f.hint) kids.push(node("div", "f-hint", f.hint));
        if (f.line) { var l = node("code", "f-line", f.line); l.title = f.line; kids.push(l); }
      }
      var li = node("li", "failure" + (f.blame === "node" ? " blames-node" : ""), null, kids);
      li.dataset.job = String(f.job_id);
      return li;
    }));
  }
  function blamePill(blame) {
    var p = node("span", "pill blame-" + (BLAME[blame] ? blame : "unknown"), "blames " + (BLAME[blame] || blame));
    p.title = blame === "node" ? "the signature points at the hardware: failures like it in several users' jobs cordon the node"
      : blame === "job" ? "the signature points at the job's own code or settings" : "the signature does not say whose fault it is";
    return p;
  }

  GF.suspectText = suspectText;
  GF.suspectWhy = suspectWhy;
  GF.evidenceText = evidenceText;
  GF.failuresList = failuresList;
})(window);
