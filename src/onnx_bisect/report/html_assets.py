"""What the HTML page carries inline: its script (the layer table's sorting and filtering, a plot column leading to
its row), its styles, and the Content-Security-Policy that lets only that script run (by its hash) and forbids
every request."""
from __future__ import annotations

import base64
import hashlib

SCRIPT = r"""
(function () {
  "use strict";
  var table = document.getElementById("layers");
  var plot = document.getElementById("plot");
  if (table) {
    var body = table.tBodies[0];
    var filter = document.getElementById("filter");
    var only = document.getElementById("only-diverged");
    var apply = function () {
      var q = filter.value.toLowerCase();
      Array.prototype.forEach.call(body.rows, function (r) {
        r.hidden = (q && r.textContent.toLowerCase().indexOf(q) < 0) || (only.checked && !r.classList.contains("bad"));
      });
    };
    filter.addEventListener("input", apply);
    only.addEventListener("change", apply);
    var key = function (row, col, numeric) {
      var cell = row.cells[col];
      var v = cell.hasAttribute("data-v") ? cell.getAttribute("data-v") : cell.textContent;
      if (!numeric) { return v.toLowerCase(); }
      v = parseFloat(v);
      return isNaN(v) ? -Infinity : v;
    };
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.addEventListener("click", function () {
        var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        var numeric = th.getAttribute("data-type") === "num";
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a, col, numeric), y = key(b, col, numeric);
          return dir * (x < y ? -1 : x > y ? 1 : 0);
        });
        rows.forEach(function (r) { body.appendChild(r); });
        Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      });
    });
  }
  if (plot) {
    plot.addEventListener("click", function (e) {
      var layer = e.target.getAttribute && e.target.getAttribute("data-layer");
      var row = layer && document.getElementById("layer-" + layer);
      if (!row) { return; }
      row.hidden = false;
      row.scrollIntoView({block: "center"});
      row.classList.remove("flash");
      void row.offsetWidth;
      row.classList.add("flash");
    });
  }
})();
"""
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
CSP = (f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{SCRIPT_HASH}'; "
       "base-uri 'none'; form-action 'none'")

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;margin:0;background:#f6f8fa}
main{max-width:1180px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.sub{color:#57606a;margin:0 0 14px}
.verdict{padding:12px 16px;border-radius:6px;border:1px solid;margin:10px 0}
.verdict.ok{background:#dafbe1;border-color:#4ac26b}.verdict.bad{background:#ffebe9;border-color:#ff8182}
.verdict strong{font-size:16px}
.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:12px 16px;margin:10px 0}
.fix{background:#ddf4ff;border-left:4px solid #0969da;padding:8px 12px;margin:8px 0}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#eff1f3;padding:1px 4px;border-radius:4px;
overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}
th,td{border-bottom:1px solid #d8dee4;padding:4px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f6f8fa;position:sticky;top:0;white-space:nowrap}#layers th{cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.bad td{background:#fff1f0}tr.first td{background:#f3e8ff;font-weight:600}tr.near td:first-child{
border-left:3px solid #8250df}tr.flash td{animation:flash 1.2s}@keyframes flash{from{background:#fff8c5}}
.controls{display:flex;gap:16px;align-items:center;margin:6px 0}
.controls input[type=search]{padding:4px 8px;width:320px}
.plot{width:100%;height:auto;background:#fff;border:1px solid #d0d7de;border-radius:6px}
.plot .frame{fill:none;stroke:#d0d7de}.plot .grid{stroke:#eaeef2}.plot .tick{font-size:11px;fill:#57606a;
text-anchor:end}.plot .axis{font-size:12px;fill:#57606a;text-anchor:middle}.plot .legend{font-size:12px;fill:#1f2328}
.plot .tolerance{stroke:#cf222e;stroke-dasharray:6 4}.plot .tolerance-label{font-size:11px;fill:#cf222e;
text-anchor:end}.plot .mark{stroke-width:1.5}.plot .mark-label{font-size:12px;font-weight:600}
.plot .bands rect{fill:transparent;cursor:pointer}.plot .bands rect:hover{fill:rgba(130,80,223,.12)}
.muted{color:#57606a}ul{margin:4px 0;padding-left:22px}footer{color:#57606a;font-size:12px;margin-top:28px}
"""
