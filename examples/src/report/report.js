// The charts of report.html, drawn as inline SVG from the page's own JSON data: no library,
// no network. Every line is a <polyline data-points="N">, every bar and timeline step a <g>;
// once all are drawn, the body's data-rendered attribute counts the plots and points (the
// tests read it).
(function () {
  "use strict";
  var body = document.body;
  var errors = [];
  function fail(message) {
    errors.push(String(message));
    body.setAttribute("data-errors", errors.join(" | "));
  }
  window.addEventListener("error", function (e) { fail(e.message); });

  var NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  // A node's time: [name, colour, index in the data's [compute, comm, idle, down]].
  var PARTS = [["compute", "#2ca02c", 0], ["idle", "#ffbb78", 2],
               ["communication", "#1f77b4", 1], ["down", "#7f7f7f", 3]];
  var W = 960;
  var runs = JSON.parse(document.getElementById("report-data").textContent);

  function svgEl(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function label(parent, x, y, s, attrs) {
    var t = svgEl("text", attrs || {}, parent);
    t.setAttribute("x", x);
    t.setAttribute("y", y);
    t.textContent = s;
    return t;
  }
  function titled(e, s) { svgEl("title", {}, e).textContent = s; return e; }
  function div(cls, parent) {
    var d = document.createElement("div");
    d.className = cls;
    parent.appendChild(d);
    return d;
  }

  function num(v) {
    if (v === 0) { return "0"; }
    var a = Math.abs(v);
    if (a >= 1e6 || a < 1e-3) { return v.toExponential(2); }
    return String(+v.toPrecision(4));
  }
  function bytes(b) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return (i ? +b.toPrecision(3) : b.toFixed(0)) + " " + units[i];
  }
  function secs(s) {
    if (s >= 3600) { return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min"; }
    if (s >= 60) { return Math.floor(s / 60) + " min " + (s % 60).toFixed(0) + " s"; }
    if (s >= 1 || s === 0) { return +s.toPrecision(3) + " s"; }
    if (s >= 1e-3) { return +(s * 1e3).toPrecision(3) + " ms"; }
    return +(s * 1e6).toPrecision(3) + " µs";
  }

  // A map from [d0, d1] (log10 of it when log) onto [r0, r1], and back.
  function scale(d0, d1, r0, r1, log) {
    var f = log ? Math.log10 : function (v) { return v; };
    var a = f(d0), b = f(d1);
    if (b === a) { a -= 0.5; b += 0.5; }
    var s = function (v) { return r0 + (f(v) - a) / (b - a) * (r1 - r0); };
    s.inv = function (r) {
      var v = a + (r - r0) / (r1 - r0) * (b - a);
      return log ? Math.pow(10, v) : v;
    };
    s.domain = [d0, d1];
    s.log = log;
    return s;
  }
  function ticks(s, n) {
    var d0 = s.domain[0], d1 = s.domain[1], out = [];
    if (s.log) {
      var lo = Math.floor(Math.log10(d0)), hi = Math.ceil(Math.log10(d1));
      var mult = hi - lo <= 2 ? [1, 2, 5] : [1];
      var stride = Math.max(1, Math.ceil((hi - lo) / 8));
      for (var k = lo; k <= hi; k += stride) {
        mult.forEach(function (m) {
          var v = m * Math.pow(10, k);
          if (v >= d0 * 0.999 && v <= d1 * 1.001) { out.push(v); }
        });
      }
      return out;
    }
    var raw = (d1 - d0) / n || 1, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
    var step = (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
    for (var v = Math.ceil(d0 / step) * step; v <= d1 + step * 1e-9; v += step) {
      out.push(+v.toPrecision(12));
    }
    return out;
  }

  // Axes, grid and labels of the area {l, r, t, b}.
  function axes(g, area, xs, ys, o) {
    ticks(xs, 8).forEach(function (v) {
      var x = xs(v);
      svgEl("line", { x1: x, x2: x, y1: area.t, y2: area.b, "class": "grid" }, g);
      label(g, x, area.b + 16, o.xFmt(v), { "class": "tick", "text-anchor": "middle" });
    });
    if (ys) {
      ticks(ys, 6).forEach(function (v) {
        var y = ys(v);
        svgEl("line", { x1: area.l, x2: area.r, y1: y, y2: y, "class": "grid" }, g);
        label(g, area.l - 6, y + 4, num(v), { "class": "tick", "text-anchor": "end" });
      });
      label(g, 14, (area.t + area.b) / 2, o.yLabel,
            { "class": "axis", "text-anchor": "middle",
              transform: "rotate(-90 14 " + (area.t + area.b) / 2 + ")" });
    }
    svgEl("rect", { x: area.l, y: area.t, width: area.r - area.l, height: area.b - area.t,
                    "class": "frame" }, g);
    label(g, (area.l + area.r) / 2, area.b + 38, o.xLabel,
          { "class": "axis", "text-anchor": "middle" });
  }

  // A figure's chart: an SVG that `draw(zoom)` fills, dragged across to zoom its x axis,
  // double-clicked to zoom out; `draw` returns the x scale and the plot area.
  function chart(fig, height, draw, hover) {
    var wrap = div("chart", fig);
    var svg = svgEl("svg", { viewBox: "0 0 " + W + " " + height, role: "img" }, wrap);
    var tip = div("tip", wrap);
    var zoom = null, view = null, drag = null, band = null;
    function redraw() {
      while (svg.firstChild) { svg.removeChild(svg.firstChild); }
      view = draw(svg, zoom);
      band = svgEl("rect", { "class": "band", y: view.area.t, height: view.area.b - view.area.t,
                             width: 0, visibility: "hidden" }, svg);
      view.hover = svgEl("g", { "class": "hover" }, svg);
    }
    function at(e) {
      var p = svg.createSVGPoint();
      p.x = e.clientX;
      p.y = e.clientY;
      var m = svg.getScreenCTM();
      return m ? p.matrixTransform(m.inverse()) : p;
    }
    function clamp(x) { return Math.max(view.area.l, Math.min(view.area.r, x)); }
    svg.addEventListener("mousedown", function (e) {
      drag = clamp(at(e).x);
      e.preventDefault();
    });
    svg.addEventListener("mousemove", function (e) {
      var p = at(e), a = view.area;
      while (view.hover.firstChild) { view.hover.removeChild(view.hover.firstChild); }
      if (drag !== null) {
        var x = clamp(p.x);
        band.setAttribute("x", Math.min(x, drag));
        band.setAttribute("width", Math.abs(x - drag));
        band.setAttribute("visibility", "visible");
      }
      if (!hover || p.x < a.l || p.x > a.r || p.y < a.t || p.y > a.b) {
        tip.style.display = "none";
        return;
      }
      var lines = hover(view, p.x);
      if (!lines.length) { tip.style.display = "none"; return; }
      tip.textContent = "";
      lines.forEach(function (l) { div("", tip).textContent = l; });
      var box = wrap.getBoundingClientRect();
      tip.style.display = "block";
      tip.style.left = Math.min(e.clientX - box.left + 14, box.width - 260) + "px";
      tip.style.top = (e.clientY - box.top + 14) + "px";
    });
    function end(e) {
      if (drag === null) { return; }
      var x = clamp(at(e).x), from = drag;
      drag = null;
      band.setAttribute("visibility", "hidden");
      if (Math.abs(x - from) > 4) {
        zoom = [view.x.inv(Math.min(x, from)), view.x.inv(Math.max(x, from))];
        redraw();
      }
    }
    svg.addEventListener("mouseup", end);
    svg.addEventListener("mouseleave", function (e) { end(e); tip.style.display = "none"; });
    svg.addEventListener("dblclick", function () { zoom = null; redraw(); });
    redraw();
    return { redraw: redraw, svg: svg };
  }

  // The index of the point of `pts` (sorted by x) nearest to x.
  function nearest(pts, x) {
    var lo = 0, hi = pts.length - 1;
    while (hi - lo > 1) {
      var mid = (lo + hi) >> 1;
      if (pts[mid][0] < x) { lo = mid; } else { hi = mid; }
    }
    return Math.abs(pts[lo][0] - x) <= Math.abs(pts[hi][0] - x) ? lo : hi;
  }

  // A line chart of `series` ({name, color, width, dots, kind, run, pts}).
  function lineChart(fig, o) {
    var series = o.series.map(function (s) {
      s.pts = s.pts.filter(function (p) {
        return p[0] !== null && p[1] !== null && isFinite(p[0]) && isFinite(p[1]) &&
          (!o.log || p[0] > 0);
      });
      return s;
    });
    var points = 0;
    series.forEach(function (s) { points += s.pts.length; });
    var all = [];
    series.forEach(function (s) { all = all.concat(s.pts); });
    if (!all.length) {
      div("note", fig).textContent = "No points to draw.";
      return 0;
    }
    var xMin = Math.min.apply(null, all.map(function (p) { return p[0]; }));
    var xMax = Math.max.apply(null, all.map(function (p) { return p[0]; }));
    if (xMin === xMax) { xMin = o.log ? xMin / 2 : xMin - 1; xMax = o.log ? xMax * 2 : xMax + 1; }
    var H = 420, area = { l: 70, r: W - 40, t: 14, b: H - 50 };
    var c = chart(fig, H, function (svg, zoom) {
      var xd = zoom || [xMin, xMax];
      var ys = [];
      series.forEach(function (s) {
        if (s.hidden) { return; }
        s.pts.forEach(function (p) { if (p[0] >= xd[0] && p[0] <= xd[1]) { ys.push(p[1]); } });
      });
      if (o.hline !== null && o.hline !== undefined) { ys.push(o.hline); }
      var y0 = ys.length ? Math.min.apply(null, ys) : 0;
      var y1 = ys.length ? Math.max.apply(null, ys) : 1;
      var pad = Math.max((y1 - y0) * 0.05, Math.abs(y1) * 1e-3, 1e-9);
      var xs = scale(xd[0], xd[1], area.l, area.r, o.log);
      var yss = scale(y0 - pad, y1 + pad, area.b, area.t, false);
      axes(svgEl("g", {}, svg), area, xs, yss, o);
      var id = "clip" + Math.random().toString(36).slice(2);
      var clip = svgEl("clipPath", { id: id }, svgEl("defs", {}, svg));
      svgEl("rect", { x: area.l, y: area.t, width: area.r - area.l, height: area.b - area.t }, clip);
      var plot = svgEl("g", { "clip-path": "url(#" + id + ")" }, svg);
      if (o.hline !== null && o.hline !== undefined) {
        titled(svgEl("line", { x1: area.l, x2: area.r, y1: yss(o.hline), y2: yss(o.hline),
                               "class": "target" }, plot), "target loss " + o.hline);
      }
      series.forEach(function (s) {
        if (s.hidden) { return; }
        var xy = s.pts.map(function (p) { return xs(p[0]).toFixed(1) + "," + yss(p[1]).toFixed(1); });
        var line = svgEl("polyline", { "class": "line", "data-series": s.name, "data-kind": s.kind,
                                       "data-run": s.run, "data-points": s.pts.length,
                                       points: xy.join(" "), stroke: s.color,
                                       "stroke-width": s.width }, plot);
        titled(line, s.name);
        if (s.dots && s.pts.length <= 400) {
          s.pts.forEach(function (p) {
            svgEl("circle", { cx: xs(p[0]), cy: yss(p[1]), r: 3, fill: s.color }, plot);
          });
        }
      });
      (o.marks || []).forEach(function (m) {
        var x = xs(m.x), y = yss(m.y);
        titled(svgEl("path", { d: "M" + x + " " + (y - 7) + "l7 7l-7 7l-7-7z", fill: m.color,
                               "class": "mark" }, plot), m.title);
      });
      return { x: xs, y: yss, area: area };
    }, function (view, px) {
      var x = view.x.inv(px), out = [o.xFmt(x)];
      svgEl("line", { x1: px, x2: px, y1: view.area.t, y2: view.area.b, "class": "cursor" },
            view.hover);
      series.forEach(function (s) {
        if (s.hidden || !s.pts.length) { return; }
        var p = s.pts[nearest(s.pts, x)];
        svgEl("circle", { cx: view.x(p[0]), cy: view.y(p[1]), r: 5, fill: "none",
                          stroke: s.color, "stroke-width": 2 }, view.hover);
        out.push(s.name + ": " + num(p[1]) + " at " + o.xFmt(p[0]));
      });
      return out;
    });
    var legend = div("legend", fig);
    series.forEach(function (s) {
      var item = document.createElement("span");
      item.className = "item";
      var swatch = document.createElement("i");
      swatch.style.background = s.color;
      swatch.style.height = s.width + "px";
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(s.name + " (" + s.pts.length + ")"));
      item.addEventListener("click", function () {
        s.hidden = !s.hidden;
        item.classList.toggle("off", !!s.hidden);
        c.redraw();
      });
      legend.appendChild(item);
    });
    return points;
  }

  // The loss of every run against x = pick(curve, i), train and validation.
  function lossChart(fig, pick, o) {
    var one = runs.length === 1, series = [];
    runs.forEach(function (r, i) {
      var color = COLORS[i % COLORS.length];
      [["train", r.train, 1.2], ["val", r.val, 2.5]].forEach(function (k) {
        var curve = k[1];
        series.push({
          name: (one ? "" : r.label + " ") + (k[0] === "train" ? "train loss" : "val loss"),
          kind: k[0], run: i, width: k[2], dots: k[0] === "val",
          color: one ? COLORS[k[0] === "train" ? 0 : 1] : color,
          pts: curve.loss.map(function (y, j) { return [pick(curve, j), y]; })
        });
      });
    });
    var target = null;
    runs.forEach(function (r) { if (r.target !== null && target === null) { target = r.target; } });
    o.series = series;
    o.hline = target;
    return lineChart(fig, o);
  }

  // Each node's time, stacked: compute, idle, communication, down; its utilisation at the end.
  function utilisation(fig) {
    var rows = [], max = 0, drawn = 0;
    runs.forEach(function (r, i) {
      if (!r.nodes.length) { return; }
      if (runs.length > 1) { rows.push({ head: r.label }); }
      r.nodes.forEach(function (t, n) {
        rows.push({ run: i, node: n, t: t });
        max = Math.max(max, t[0] + t[1] + t[2] + t[3]);
      });
      if (r.num_nodes > r.nodes.length) {
        rows.push({ head: "(the first " + r.nodes.length + " of " + r.num_nodes + " nodes)" });
      }
    });
    var rowH = 18, area = { l: 150, r: W - 70, t: 8, b: 8 + rows.length * rowH };
    var H = area.b + 50;
    chart(fig, H, function (svg, zoom) {
      var xs = scale(zoom ? zoom[0] : 0, zoom ? zoom[1] : max || 1, area.l, area.r, false);
      axes(svgEl("g", {}, svg), area, xs, null,
           { xFmt: secs, xLabel: "simulated time per node" });
      rows.forEach(function (row, k) {
        var y = area.t + k * rowH;
        if (row.head) {
          label(svg, area.l - 140, y + 13, row.head, { "class": "head" });
          return;
        }
        var r = runs[row.run], t = row.t, total = t[0] + t[1] + t[2] + t[3];
        var g = svgEl("g", { "class": "node-bar", "data-run": row.run, "data-node": row.node },
                      svg);
        label(g, area.l - 6, y + 13, "node " + row.node, { "class": "tick", "text-anchor": "end" });
        var x = 0;
        PARTS.forEach(function (part) {
          var v = t[part[2]];
          if (v > 0) {
            titled(svgEl("rect", { x: xs(x), y: y + 2, width: Math.max(0, xs(x + v) - xs(x)),
                                   height: rowH - 4, fill: part[1] }, g),
                   r.label + ", node " + row.node + ": " + part[0] + " " + secs(v) + " (" +
                   (100 * v / (total || 1)).toFixed(1) + "%)");
          }
          x += v;
        });
        var busy = t[0] + t[1] + t[2];
        label(g, area.r + 6, y + 13, busy > 0 ? (100 * t[0] / busy).toFixed(1) + "%" : "-",
              { "class": "tick" });
      });
      return { x: xs, area: area };
    });
    partsLegend(fig);
    runs.forEach(function (r) { drawn += r.nodes.length; });
    return drawn;
  }

  function partsLegend(fig) {
    var legend = div("legend", fig);
    PARTS.forEach(function (part) {
      var item = document.createElement("span");
      item.className = "item static";
      var swatch = document.createElement("i");
      swatch.style.background = part[1];
      swatch.style.height = "10px";
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(part[0]));
      legend.appendChild(item);
    });
  }

  // Run `r`'s first steps: a row per node, each step's parts in turn on the simulated clock.
  function timeline(fig, r) {
    var steps = r.first, nodes = steps[0].length, t0 = Infinity, t1 = 0;
    steps.forEach(function (step) {
      step.forEach(function (t) {
        t0 = Math.min(t0, t[4] - t[0] - t[1] - t[2] - t[3]);
        t1 = Math.max(t1, t[4]);
      });
    });
    var rowH = Math.max(8, Math.min(22, Math.floor(480 / nodes)));
    var area = { l: 70, r: W - 40, t: 8, b: 8 + nodes * rowH };
    chart(fig, area.b + 50, function (svg, zoom) {
      var xs = scale(zoom ? zoom[0] : t0, zoom ? zoom[1] : (t1 > t0 ? t1 : t0 + 1),
                     area.l, area.r, false);
      axes(svgEl("g", {}, svg), area, xs, null,
           { xFmt: secs, xLabel: "simulated time (the first " + steps.length + " steps)" });
      var id = "clip" + Math.random().toString(36).slice(2);
      var clip = svgEl("clipPath", { id: id }, svgEl("defs", {}, svg));
      svgEl("rect", { x: area.l, y: area.t, width: area.r - area.l, height: area.b - area.t }, clip);
      var plot = svgEl("g", { "clip-path": "url(#" + id + ")" }, svg);
      for (var n = 0; n < nodes; n++) {
        label(svg, area.l - 6, area.t + n * rowH + rowH * 0.75, "node " + n,
              { "class": "tick", "text-anchor": "end" });
      }
      steps.forEach(function (step, s) {
        step.forEach(function (t, n) {
          var g = svgEl("g", { "class": "step", "data-step": r.first_step + s, "data-node": n },
                        plot);
          var x = t[4] - t[0] - t[1] - t[2] - t[3], y = area.t + n * rowH + 1;
          PARTS.forEach(function (part) {
            var v = t[part[2]];
            if (v > 0) {
              titled(svgEl("rect", { x: xs(x), y: y, width: Math.max(0.5, xs(x + v) - xs(x)),
                                     height: rowH - 2, fill: part[1] }, g),
                     "node " + n + ", step " + (r.first_step + s) + ": " + part[0] + " " +
                     secs(v) + " (" + secs(x) + " to " + secs(x + v) + ")");
            }
            x += v;
          });
        });
      });
      return { x: xs, area: area };
    });
    partsLegend(fig);
    return steps.length * nodes;
  }

  var plots = 0, points = 0;
  function done(fig, n) {
    fig.setAttribute("data-points", n);
    plots++;
    points += n;
  }
  var figures = document.querySelectorAll("figure[data-plot]");
  for (var f = 0; f < figures.length; f++) {
    var fig = figures[f], kind = fig.getAttribute("data-plot");
    try {
      if (kind === "loss-step") {
        done(fig, lossChart(fig, function (c, j) { return c.step[j]; },
                            { xFmt: num, xLabel: "step", yLabel: "loss" }));
      } else if (kind === "loss-time") {
        var marks = [];
        runs.forEach(function (r, i) {
          // On the evaluation that first reached the target.
          var at = r.val.loss.findIndex(function (l) { return l !== null && l <= r.target; });
          if (r.time_to_target !== null && r.target !== null && at >= 0) {
            marks.push({ x: r.time_to_target, y: r.val.loss[at],
                         color: runs.length === 1 ? "#d62728" : COLORS[i % COLORS.length],
                         title: r.label + ": loss " + r.target + " at " + secs(r.time_to_target) });
          }
        });
        done(fig, lossChart(fig, function (c, j) { return c.time[j]; },
                            { xFmt: secs, xLabel: "simulated time", yLabel: "loss",
                              marks: marks }));
      } else if (kind === "loss-bytes") {
        done(fig, lossChart(fig, function (c, j) { return c.bytes[j]; },
                            { xFmt: bytes, xLabel: "bytes sent per node (log scale)",
                              yLabel: "loss", log: true }));
      } else if (kind === "utilisation") {
        done(fig, utilisation(fig));
      } else if (kind === "timeline") {
        done(fig, timeline(fig, runs[+fig.getAttribute("data-run")]));
      }
    } catch (e) {
      fail(kind + ": " + (e && e.message ? e.message : e));
    }
  }
  body.setAttribute("data-rendered", plots + " plots, " + points + " points");
})();
