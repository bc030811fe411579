// fedlearn coordinator dashboard.
//
// Polls /api/status (1 s), /api/parameters (3 s) and /metrics (2 s, for the transfers
// cards) and updates the page in place. Every
// string from the server reaches the DOM through textContent or an attribute, never as
// markup. Plots are inline SVG drawn by drawLinePlot / drawBarChart below.
//
// Test hooks (read by a headless-browser test, keep them stable):
//   #phase #round #clients-joined #selected #responded #dropped #rejected #final-accuracy
//     textContent is the plain value.
//   #dp-epsilon (central DP only; section#privacy hidden otherwise)
//   svg#plot-loss, #plot-accuracy, #plot-durations, #plot-bytes, #plot-norms, #plot-epsilon: one
//     <polyline data-series=NAME data-points=N> per series, N = values drawn.
//   <body data-status-round=R data-updated=1> after the first successful render.
//   #downloads #receive-buffers ("IN_USE / ALL") #downloads-cut-off #uploads-cut-off
//     textContent is the plain value from /metrics; <body data-metrics-updated=1> once shown.
//   table#clients: <tr data-client-id=ID> per client; table#tensors: <tr data-tensor=NAME>.
'use strict';

(function () {
  const STATUS_PERIOD_MS = 1000;
  const PARAMS_PERIOD_MS = 3000;
  const METRICS_PERIOD_MS = 2000;
  const FETCH_TIMEOUT_MS = 5000;
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const PHASES = ['UNSPECIFIED', 'WAITING_FOR_CLIENTS', 'TRAINING', 'EVALUATING', 'DONE'];
  const CLIENT_STATES = ['ready', 'training', 'evaluating', 'gone'];
  const COLORS = {
    train: '#2563eb',
    validation: '#ea580c',
    test: '#16a34a',
    trainingBar: '#3b82f6',
    evaluationBar: '#8b5cf6',
    abandonedBar: '#ef4444',
    received: '#0d9488',
    sent: '#6366f1',
    normLatest: '#2563eb',
    normOlder: '#94a3b8',
    epsilon: '#7c3aed',
    budget: '#ef4444',
  };

  // ---------------------------------------------------------------------------------
  // Small helpers.

  // int64 fields arrive as JSON strings; anything missing or malformed reads as 0.
  function num(v) {
    const n = Number(v);
    return Number.isFinite(n) ? n : 0;
  }

  function $(id) {
    return document.getElementById(id);
  }

  function setText(id, text) {
    const node = $(id);
    if (node && node.textContent !== text) node.textContent = text;
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const k in attrs) {
      if (attrs[k] !== undefined && attrs[k] !== null) node.setAttribute(k, String(attrs[k]));
    }
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function withTitle(node, text) {
    if (text) node.appendChild(svgEl('title', {}, text));
    return node;
  }

  function fmtInt(n) {
    return Math.round(num(n)).toLocaleString('en-US');
  }

  function fmtPct(fraction, digits) {
    return (num(fraction) * 100).toFixed(digits === undefined ? 2 : digits) + '%';
  }

  // Significant-digit formatting for statistics that span many magnitudes.
  function fmtSig(x, digits) {
    x = num(x);
    if (x === 0) return '0';
    const a = Math.abs(x);
    if (a < 1e-3 || a >= 1e6) return x.toExponential(Math.max(0, (digits || 4) - 2));
    return String(Number(x.toPrecision(digits || 4)));
  }

  function fmtBytes(b) {
    b = num(b);
    if (b < 1e3) return b.toFixed(0) + ' B';
    if (b < 1e6) return (b / 1e3).toFixed(1) + ' kB';
    if (b < 1e9) return (b / 1e6).toFixed(2) + ' MB';
    return (b / 1e9).toFixed(2) + ' GB';
  }

  function fmtSeconds(s) {
    s = num(s);
    if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + ' s';
    const m = Math.floor(s / 60);
    return m + ' min ' + String(Math.round(s - m * 60)).padStart(2, '0') + ' s';
  }

  function fmtAgo(ms) {
    ms = num(ms);
    if (ms < 1000) return Math.round(ms) + ' ms ago';
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s ago';
    if (ms < 3600000) return Math.round(ms / 60000) + ' min ago';
    return (ms / 3600000).toFixed(1) + ' h ago';
  }

  function phaseName(p) {
    if (typeof p === 'number') return PHASES[p] || 'UNSPECIFIED';
    const s = String(p || 'PHASE_UNSPECIFIED');
    return s.startsWith('PHASE_') ? s.slice(6) : s;
  }

  function rejectedTotal(rejected) {
    let total = 0;
    for (const k in rejected || {}) total += num(rejected[k]);
    return total;
  }

  // The final evaluation counts once the run is done or once it has examples.
  function finalEvaluation(status) {
    const fe = status.final_evaluation;
    if (!fe) return null;
    if (phaseName(status.phase) === 'DONE' || num(fe.num_examples) > 0) return fe;
    return null;
  }

  function isTrainingRecord(r) {
    return !r.evaluation && r.outcome !== 'abandoned';
  }

  function recordLabel(r) {
    const attempt = num(r.attempt) > 1 ? '.' + num(r.attempt) : '';
    return (r.evaluation ? 'E' : '') + num(r.round) + attempt;
  }

  function recordTitle(r) {
    const kind = r.evaluation ? 'evaluation attempt' : 'round';
    let s = kind + ' ' + num(r.round);
    if (!r.evaluation && num(r.attempt) > 1) s += ' attempt ' + num(r.attempt);
    return s;
  }

  // ---------------------------------------------------------------------------------
  // Scales.

  function niceStep(range, target) {
    const raw = range / Math.max(1, target);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / mag;
    const step = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10;
    return step * mag;
  }

  // Extends [lo, hi] to multiples of a round step; returns the ticks too.
  function niceScale(lo, hi, target, integer) {
    if (!(hi > lo)) {
      const pad = integer ? 1 : (Math.abs(lo) > 0 ? Math.abs(lo) * 0.1 : 1);
      lo -= pad;
      hi += pad;
    }
    let step = niceStep(hi - lo, target);
    if (integer) step = Math.max(1, Math.ceil(step));
    const min = Math.floor(lo / step + 1e-9) * step;
    const max = Math.ceil(hi / step - 1e-9) * step;
    return {min: min, max: max, step: step, ticks: ticksOf(min, max, step)};
  }

  function ticksOf(min, max, step) {
    const ticks = [];
    for (let i = 0, v = min; v <= max + step * 1e-6 && i < 100; i++, v = min + i * step) {
      ticks.push(Number(v.toPrecision(12)));
    }
    return ticks;
  }

  // Integer axis spanning exactly the data (rounds), ticks at round multiples of a step
  // plus the first value when it is far enough from the next tick.
  function roundScale(values, target) {
    const lo = Math.min.apply(null, values);
    const hi = Math.max.apply(null, values);
    if (hi - lo < 1) return {min: lo - 1, max: hi + 1, step: 1, ticks: [lo]};
    const scale = niceScale(lo, hi, target, true);
    const ticks = scale.ticks.filter(t => t >= lo && t <= hi);
    if (!ticks.length || ticks[0] - lo >= scale.step * 0.4) ticks.unshift(lo);
    return {min: lo, max: hi, step: scale.step, ticks: ticks};
  }

  function clampScale(scale, floor, ceil) {
    if (floor !== undefined && scale.min < floor) scale.min = floor;
    if (ceil !== undefined && scale.max > ceil) scale.max = ceil;
    scale.ticks = scale.ticks.filter(t => t >= scale.min - 1e-12 && t <= scale.max + 1e-12);
    return scale;
  }

  function textWidth(text, px) {
    return String(text).length * (px || 11) * 0.6;
  }

  function plotWidth(svg) {
    const w = svg.parentElement ? svg.parentElement.clientWidth : 0;
    return Math.max(280, Math.floor(w || 560));
  }

  function startPlot(svg, width, height) {
    svg.replaceChildren();
    svg.setAttribute('viewBox', '0 0 ' + width + ' ' + height);
    svg.setAttribute('width', String(width));
    svg.setAttribute('height', String(height));
  }

  // Legend along the top edge; items: {label, color, dash, kind: 'line'|'box', dim}.
  function drawLegend(svg, items, x0, y) {
    const g = svgEl('g', {class: 'legend'});
    let x = x0;
    for (const it of items) {
      const item = svgEl('g', {class: it.dim ? 'legend-item dim' : 'legend-item'});
      if (it.kind === 'box') {
        item.appendChild(svgEl('rect', {x: x, y: y - 5, width: 12, height: 10, rx: 2, fill: it.color}));
        x += 17;
      } else {
        item.appendChild(svgEl('line', {
          x1: x, y1: y, x2: x + 20, y2: y, stroke: it.color, 'stroke-width': 2,
          'stroke-dasharray': it.dash ? '5 3' : null,
        }));
        item.appendChild(svgEl('circle', {cx: x + 10, cy: y, r: 3.2, fill: it.color, stroke: '#fff', 'stroke-width': 1.2}));
        x += 25;
      }
      item.appendChild(svgEl('text', {x: x, y: y + 4, class: 'legend-text'}, it.label));
      x += textWidth(it.label, 12) + 18;
      g.appendChild(item);
    }
    svg.appendChild(g);
  }

  function drawYAxis(svg, m, width, height, yScale, sy, format, label) {
    const g = svgEl('g', {class: 'axis y-axis'});
    for (const t of yScale.ticks) {
      const y = Math.round(sy(t)) + 0.5;
      g.appendChild(svgEl('line', {x1: m.l, y1: y, x2: width - m.r, y2: y, class: 'grid'}));
      g.appendChild(svgEl('text', {x: m.l - 7, y: y + 4, 'text-anchor': 'end', class: 'tick'}, format(t, yScale.step)));
    }
    g.appendChild(svgEl('line', {x1: m.l + 0.5, y1: m.t, x2: m.l + 0.5, y2: height - m.b, class: 'axis-line'}));
    const cy = (m.t + height - m.b) / 2;
    g.appendChild(svgEl('text', {
      x: 13, y: cy, 'text-anchor': 'middle', class: 'axis-label', transform: 'rotate(-90 13 ' + cy + ')',
    }, label));
    svg.appendChild(g);
  }

  function drawXAxisLine(svg, m, width, height, label) {
    const y = height - m.b + 0.5;
    svg.appendChild(svgEl('line', {x1: m.l, y1: y, x2: width - m.r, y2: y, class: 'axis-line'}));
    svg.appendChild(svgEl('text', {
      x: (m.l + width - m.r) / 2, y: height - 6, 'text-anchor': 'middle', class: 'axis-label',
    }, label));
  }

  function drawEmpty(svg, m, width, height, text) {
    svg.appendChild(svgEl('text', {
      x: (m.l + width - m.r) / 2, y: (m.t + height - m.b) / 2, 'text-anchor': 'middle', class: 'empty-text',
    }, text));
  }

  // ---------------------------------------------------------------------------------
  // Line plot. spec: {height, xLabel, yLabel, yFormat(v, step), includeZero, yFloor, yCeil,
  //   emptyText, series: [{id, label, color, dash, points: [{x, y, title}], hline: {y, title, text}}]}
  // Every series gets a polyline (data-points = points drawn), even when it has none.
  function drawLinePlot(svg, spec) {
    const width = plotWidth(svg);
    const height = spec.height || 270;
    const m = {l: 60, r: 20, t: 34, b: 44};
    startPlot(svg, width, height);

    const xs = [];
    const ys = [];
    for (const s of spec.series) {
      for (const p of s.points) { xs.push(p.x); ys.push(p.y); }
      if (s.hline) ys.push(s.hline.y);
    }
    const hasData = xs.length > 0;
    let yLo = ys.length ? Math.min.apply(null, ys) : 0;
    let yHi = ys.length ? Math.max.apply(null, ys) : 1;
    if (spec.includeZero) yLo = Math.min(0, yLo);
    if (!ys.length && spec.yCeil !== undefined) { yLo = spec.yFloor || 0; yHi = spec.yCeil; }
    const yScale = clampScale(niceScale(yLo, yHi, 5, false), spec.yFloor, spec.yCeil);
    const xScale = hasData ? roundScale(xs, Math.max(2, Math.floor((width - m.l - m.r) / 70)))
      : {min: 0, max: 1, step: 1, ticks: []};

    const pw = width - m.l - m.r;
    const ph = height - m.t - m.b;
    const sx = x => m.l + (x - xScale.min) / ((xScale.max - xScale.min) || 1) * pw;
    const sy = y => m.t + ph - (y - yScale.min) / ((yScale.max - yScale.min) || 1) * ph;

    drawYAxis(svg, m, width, height, yScale, sy, spec.yFormat, spec.yLabel);
    drawXAxisLine(svg, m, width, height, spec.xLabel);
    const gx = svgEl('g', {class: 'axis x-axis'});
    for (const t of xScale.ticks) {
      const x = Math.round(sx(t)) + 0.5;
      gx.appendChild(svgEl('line', {x1: x, y1: height - m.b, x2: x, y2: height - m.b + 5, class: 'axis-line'}));
      gx.appendChild(svgEl('text', {x: x, y: height - m.b + 18, 'text-anchor': 'middle', class: 'tick'}, String(t)));
    }
    svg.appendChild(gx);

    drawLegend(svg, spec.series.map(s => ({
      label: s.label, color: s.color, dash: s.dash,
      dim: s.points.length === 0 && !s.hline,
    })), m.l, 14);

    const radius = xs.length > 240 ? 1.6 : xs.length > 90 ? 2.4 : 3.4;
    const xMaxData = hasData ? Math.max.apply(null, xs) : xScale.max;
    for (const s of spec.series) {
      const g = svgEl('g', {class: 'series'});
      let pts = s.points;
      let coords;
      if (s.hline) {
        pts = [{x: xMaxData, y: s.hline.y, title: s.hline.title}];
        const y = sy(s.hline.y).toFixed(1);
        coords = m.l + ',' + y + ' ' + (width - m.r) + ',' + y;
      } else {
        coords = pts.map(p => sx(p.x).toFixed(1) + ',' + sy(p.y).toFixed(1)).join(' ');
      }
      g.appendChild(svgEl('polyline', {
        'data-series': s.id, 'data-points': s.hline ? 1 : pts.length,
        points: coords, fill: 'none', stroke: s.color, 'stroke-width': s.hline ? 1.6 : 2,
        'stroke-dasharray': s.dash ? '6 4' : null, 'stroke-linejoin': 'round', 'stroke-linecap': 'round',
      }));
      for (const p of pts) {
        g.appendChild(withTitle(svgEl('circle', {
          cx: sx(p.x).toFixed(1), cy: sy(p.y).toFixed(1), r: s.hline ? 4.2 : radius,
          fill: s.color, stroke: '#fff', 'stroke-width': 1.3, class: 'marker',
        }), p.title));
      }
      if (s.hline && s.hline.text) {
        const y = sy(s.hline.y);
        const above = y - 8 > m.t + 4;
        g.appendChild(svgEl('text', {
          x: m.l + 8, y: above ? y - 7 : y + 16, 'text-anchor': 'start', class: 'hline-label', fill: s.color,
        }, s.hline.text));
      }
      svg.appendChild(g);
    }
    if (!hasData) drawEmpty(svg, m, width, height, spec.emptyText || 'no data yet');
  }

  // ---------------------------------------------------------------------------------
  // Bar chart over categories. spec: {height, xLabel, yLabel, yFormat, emptyText, legend,
  //   categories: [label], series: [{id, color, values: [], colors: [], titles: []}]}
  // Each series is drawn as filled rects plus one polyline tracing the bar outlines, which
  // carries data-series and data-points (= bars drawn).
  function drawBarChart(svg, spec) {
    const width = plotWidth(svg);
    const height = spec.height || 270;
    const m = {l: 60, r: 20, t: 34, b: 44};
    startPlot(svg, width, height);

    const n = spec.categories.length;
    let yHi = 0;
    for (const s of spec.series) for (const v of s.values) yHi = Math.max(yHi, num(v));
    const yScale = niceScale(0, yHi > 0 ? yHi : 1, 5, false);
    const pw = width - m.l - m.r;
    const ph = height - m.t - m.b;
    const sy = y => m.t + ph - (y - yScale.min) / ((yScale.max - yScale.min) || 1) * ph;
    const base = sy(0);

    drawYAxis(svg, m, width, height, yScale, sy, spec.yFormat, spec.yLabel);
    drawXAxisLine(svg, m, width, height, spec.xLabel);
    drawLegend(svg, spec.legend, m.l, 14);

    const band = n ? pw / n : pw;
    const group = Math.min(band * 0.78, 56 * spec.series.length);
    const barW = group / spec.series.length;

    // Category labels, thinned so they never overlap.
    const longest = spec.categories.reduce((a, c) => Math.max(a, textWidth(c, 11)), 0);
    const every = Math.max(1, Math.ceil((longest + 8) / band));
    const gx = svgEl('g', {class: 'axis x-axis'});
    spec.categories.forEach((c, i) => {
      if (i % every !== 0) return;
      const x = m.l + band * (i + 0.5);
      gx.appendChild(svgEl('text', {x: x.toFixed(1), y: height - m.b + 16, 'text-anchor': 'middle', class: 'tick'}, c));
    });
    svg.appendChild(gx);

    spec.series.forEach((s, si) => {
      const g = svgEl('g', {class: 'series'});
      const outline = [];
      s.values.forEach((v, i) => {
        const x0 = m.l + band * i + (band - group) / 2 + barW * si;
        const x1 = x0 + Math.max(1, barW - (spec.series.length > 1 ? 1 : 0));
        let top = sy(num(v));
        if (num(v) > 0 && base - top < 1) top = base - 1;
        g.appendChild(withTitle(svgEl('rect', {
          x: x0.toFixed(1), y: top.toFixed(1), width: (x1 - x0).toFixed(1), height: Math.max(0, base - top).toFixed(1),
          fill: (s.colors && s.colors[i]) || s.color, class: 'bar',
        }), s.titles && s.titles[i]));
        outline.push(x0.toFixed(1) + ',' + base.toFixed(1), x0.toFixed(1) + ',' + top.toFixed(1),
                     x1.toFixed(1) + ',' + top.toFixed(1), x1.toFixed(1) + ',' + base.toFixed(1));
      });
      g.appendChild(svgEl('polyline', {
        'data-series': s.id, 'data-points': s.values.length, points: outline.join(' '),
        fill: 'none', class: barW < 5 ? 'bar-outline faint' : 'bar-outline',
      }));
      svg.appendChild(g);
    });
    if (!n) drawEmpty(svg, m, width, height, spec.emptyText || 'no data yet');
  }

  // Histogram of one tensor's values: a filled step polyline, one <title> per bin.
  function drawHistogram(svg, hist) {
    const width = 180;
    const height = 36;
    startPlot(svg, width, height);
    const counts = (hist && hist.counts || []).map(num);
    const lo = num(hist && hist.lo);
    const hi = num(hist && hist.hi);
    const n = counts.length;
    const peak = Math.max(1, Math.max.apply(null, counts.concat([0])));
    const bw = n ? width / n : width;
    const sy = c => height - 1 - (c / peak) * (height - 3);
    const pts = [];
    counts.forEach((c, i) => {
      pts.push((i * bw).toFixed(1) + ',' + sy(c).toFixed(1), ((i + 1) * bw).toFixed(1) + ',' + sy(c).toFixed(1));
    });
    if (n) {
      const area = ['0,' + (height - 1)].concat(pts, [width + ',' + (height - 1)]);
      svg.appendChild(svgEl('polyline', {
        'data-series': 'histogram', 'data-points': n, points: area.join(' '), class: 'hist',
      }));
    }
    if (lo < 0 && hi > 0) {
      const x = ((0 - lo) / (hi - lo) * width).toFixed(1);
      svg.appendChild(svgEl('line', {x1: x, y1: 0, x2: x, y2: height, class: 'hist-zero'}));
    }
    const binW = n ? (hi - lo) / n : 0;
    counts.forEach((c, i) => {
      svg.appendChild(withTitle(svgEl('rect', {
        x: (i * bw).toFixed(1), y: 0, width: bw.toFixed(1), height: height, class: 'hist-hit',
      }), '[' + fmtSig(lo + i * binW) + ', ' + fmtSig(lo + (i + 1) * binW) + '): ' + fmtInt(c)));
    });
    svg.appendChild(svgEl('line', {x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5, class: 'hist-base'}));
  }

  // ---------------------------------------------------------------------------------
  // Rendering of /api/status.

  const drawn = {};  // plot id -> key of the data last drawn, to skip identical redraws

  function drawIfChanged(id, key, draw) {
    const svg = $(id);
    const fullKey = plotWidth(svg) + '|' + key;
    if (drawn[id] === fullKey) return;
    drawn[id] = fullKey;
    draw(svg);
  }

  function renderHeader(status) {
    const runId = String(status.run_id || '');
    setText('run-id', runId ? runId.slice(0, 12) + (runId.length > 12 ? '…' : '') : '—');
    $('run-id').title = runId;
    const model = status.model || {};
    setText('model-name', model.name || '—');
    let params = num(model.num_parameters);
    if (!params && Array.isArray(model.tensors)) {
      params = model.tensors.reduce((a, t) => a + (t.shape || []).reduce((p, d) => p * num(d), 1), 0);
    }
    setText('model-params', params ? '· ' + fmtInt(params) + ' parameters' : '');

    const phase = phaseName(status.phase);
    setText('phase', phase);
    $('phase').className = 'badge phase-' + (PHASES.includes(phase) ? phase : 'UNSPECIFIED');
    setText('round', String(num(status.round)));
    setText('stop-reason', status.stop_reason ? String(status.stop_reason) : '—');

    const fe = finalEvaluation(status);
    setText('final-accuracy', fe ? fmtPct(fe.test_accuracy) : '—');
    $('final-accuracy').title = fe
      ? 'test loss ' + fmtSig(fe.test_loss) + ' over ' + fmtInt(fe.num_examples) + ' examples from ' +
        fmtInt(fe.num_clients) + ' clients'
      : '';
  }

  function renderCards(status) {
    const history = status.history || [];
    // Counts of every client; the list is one page of them.
    const counts = status.client_counts || {};
    const joined = num(counts.joined);
    const gone = num(counts.gone);
    const busy = num(counts.training) + num(counts.evaluating);
    setText('clients-joined', fmtInt(joined));
    setText('clients-joined-sub', gone ? fmtInt(gone) + ' gone' : '');
    setText('clients-alive', fmtInt(joined - gone));
    setText('clients-alive-sub', fmtInt(busy) + ' busy · ' + fmtInt(num(counts.ready)) + ' idle');

    const open = status.current_round && typeof status.current_round === 'object' ? status.current_round : null;
    const rec = open || (history.length ? history[history.length - 1] : null);
    if (!rec) {
      setText('round-source', 'no round has started yet');
    } else if (open) {
      setText('round-source', recordTitle(rec) + ' · open');
    } else {
      setText('round-source', 'last closed: ' + recordTitle(rec) + ' · ' + (rec.outcome || '?'));
    }
    const selected = rec ? num(rec.selected) : 0;
    const responded = rec ? num(rec.responded) : 0;
    setText('selected', String(selected));
    setText('selected-sub', rec && rec.evaluation ? 'evaluation' : '');
    setText('responded', String(responded));
    setText('responded-sub', selected ? fmtPct(responded / selected, 0) + ' of selected' : '');
    setText('dropped', String(rec ? num(rec.dropped) : 0));
    setText('dropped-sub', rec && !open && rec.outcome ? 'outcome: ' + rec.outcome : '');
    const rejected = rec ? rec.rejected || {} : {};
    setText('rejected', String(rejectedTotal(rejected)));
    const reasons = Object.keys(rejected).filter(k => num(rejected[k]) > 0)
      .map(k => k.replace(/_/g, ' ') + ' ' + num(rejected[k]));
    setText('rejected-sub', reasons.join(' · '));
  }

  function renderCurves(status) {
    const history = status.history || [];
    const train = history.filter(isTrainingRecord);
    const tip = (r, what, v) => recordTitle(r) + ' · ' + what + ' ' + v + ' · ' +
      fmtInt(r.metrics && r.metrics.num_examples) + ' examples · ' + num(r.responded) + '/' + num(r.selected) + ' clients';
    const val = train.filter(r => r.metrics && r.metrics.has_validation);
    const pts = (rs, field, fmt, what) => rs.map(r => {
      const v = num(r.metrics && r.metrics[field]);
      return {x: num(r.round), y: v, title: tip(r, what, fmt(v))};
    });
    const loss = [
      {id: 'train_loss', label: 'train loss', color: COLORS.train, points: pts(train, 'train_loss', fmtSig, 'train loss')},
      {id: 'validation_loss', label: 'validation loss', color: COLORS.validation,
       points: pts(val, 'validation_loss', fmtSig, 'validation loss')},
    ];
    const fe = finalEvaluation(status);
    const acc = [
      {id: 'train_accuracy', label: 'train', color: COLORS.train, points: pts(train, 'train_accuracy', fmtPct, 'train accuracy')},
      {id: 'validation_accuracy', label: 'validation', color: COLORS.validation,
       points: pts(val, 'validation_accuracy', fmtPct, 'validation accuracy')},
      {id: 'final_test', label: 'final test', color: COLORS.test, dash: true, points: [],
       hline: fe ? {
         y: num(fe.test_accuracy), text: 'final test ' + fmtPct(fe.test_accuracy),
         title: 'final test accuracy ' + fmtPct(fe.test_accuracy) + ' · loss ' + fmtSig(fe.test_loss) + ' · ' +
           fmtInt(fe.num_examples) + ' examples, ' + fmtInt(fe.num_clients) + ' clients',
       } : null},
    ];

    drawIfChanged('plot-loss', JSON.stringify(loss), svg => drawLinePlot(svg, {
      xLabel: 'round', yLabel: 'loss', includeZero: true, series: loss,
      yFormat: (v, step) => step >= 1 ? String(v) : v.toFixed(Math.min(6, Math.max(0, -Math.floor(Math.log10(step))))),
      emptyText: 'waiting for the first round to close',
    }));
    drawIfChanged('plot-accuracy', JSON.stringify(acc), svg => drawLinePlot(svg, {
      xLabel: 'round', yLabel: 'accuracy', yFloor: 0, yCeil: 1, series: acc,
      yFormat: (v, step) => (v * 100).toFixed(step * 100 < 1 ? 1 : 0) + '%',
      emptyText: 'waiting for the first round to close',
    }));

    const last = train[train.length - 1];
    const lm = (last && last.metrics) || {};
    setText('loss-summary', last ? 'round ' + num(last.round) + ': train ' + fmtSig(lm.train_loss) +
      (lm.has_validation ? ' · validation ' + fmtSig(lm.validation_loss) : '') : '');
    setText('accuracy-summary', last ? 'round ' + num(last.round) + ': train ' + fmtPct(lm.train_accuracy) +
      (lm.has_validation ? ' · validation ' + fmtPct(lm.validation_accuracy) : '') : '');
  }

  function renderRounds(status) {
    const history = status.history || [];
    const categories = history.map(recordLabel);
    const kindColor = r => r.outcome === 'abandoned' ? COLORS.abandonedBar
      : r.evaluation ? COLORS.evaluationBar : COLORS.trainingBar;
    // Async mode: one update per record, so its staleness and scale say more
    // than responded/selected.
    const describe = r => recordTitle(r) + ' · ' + (r.outcome || '?') + ' · ' + (r.outcome === 'async'
      ? 'staleness ' + num(r.staleness) + ', applied at ' + num(r.update_scale).toFixed(3)
      : num(r.responded) + '/' + num(r.selected) + ' responded, ' + num(r.dropped) + ' dropped');
    const durations = {
      id: 'duration_seconds', color: COLORS.trainingBar,
      values: history.map(r => num(r.duration_seconds)),
      colors: history.map(kindColor),
      titles: history.map(r => describe(r) + ' · ' + fmtSeconds(r.duration_seconds)),
    };
    const legend = [{label: 'training', color: COLORS.trainingBar, kind: 'box'}];
    if (history.some(r => r.evaluation && r.outcome !== 'abandoned')) {
      legend.push({label: 'evaluation', color: COLORS.evaluationBar, kind: 'box'});
    }
    legend.push({label: 'abandoned', color: COLORS.abandonedBar, kind: 'box',
                 dim: !history.some(r => r.outcome === 'abandoned')});
    drawIfChanged('plot-durations', JSON.stringify([categories, durations, legend]), svg => drawBarChart(svg, {
      categories: categories, series: [durations], legend: legend,
      xLabel: 'round (E = evaluation, .N = attempt)', yLabel: 'seconds',
      yFormat: (v, step) => step >= 1 ? String(v) : v.toFixed(Math.min(3, -Math.floor(Math.log10(step)))),
      emptyText: 'no closed round yet',
    }));
    const total = history.reduce((a, r) => a + num(r.duration_seconds), 0);
    setText('duration-summary', history.length
      ? history.length + ' records · ' + fmtSeconds(total) + ' total · mean ' + fmtSeconds(total / history.length) : '');

    const mb = v => num(v) / 1e6;
    const bytes = [
      {id: 'bytes_received', color: COLORS.received, values: history.map(r => mb(r.bytes_received)),
       titles: history.map(r => recordTitle(r) + ' · received ' + fmtBytes(r.bytes_received))},
      {id: 'bytes_sent', color: COLORS.sent, values: history.map(r => mb(r.bytes_sent)),
       titles: history.map(r => recordTitle(r) + ' · sent ' + fmtBytes(r.bytes_sent))},
    ];
    const bytesLegend = [
      {label: 'received (updates in)', color: COLORS.received, kind: 'box'},
      {label: 'sent (weights out)', color: COLORS.sent, kind: 'box'},
    ];
    drawIfChanged('plot-bytes', JSON.stringify([categories, bytes]), svg => drawBarChart(svg, {
      categories: categories, series: bytes, legend: bytesLegend,
      xLabel: 'round (E = evaluation, .N = attempt)', yLabel: 'MB',
      yFormat: (v, step) => step >= 1 ? String(v) : v.toFixed(Math.min(3, -Math.floor(Math.log10(step)))),
      emptyText: 'no closed round yet',
    }));
    setText('bytes-total-received', fmtBytes(status.bytes_received));
    setText('bytes-total-sent', fmtBytes(status.bytes_sent));
  }

  // Rows are keyed by client id and updated in place.
  const clientRows = new Map();

  function makeClientRow(id) {
    const tr = el('tr');
    tr.dataset.clientId = id;
    const cells = {
      id: el('td', 'mono'), name: el('td'), state: el('td'), progress: el('td', 'progress-col'),
      rounds: el('td', 'num'), seen: el('td', 'num'), norm: el('td', 'num'),
    };
    cells.stateBadge = el('span', 'badge');
    cells.polling = el('span', 'muted small polling');
    cells.state.append(cells.stateBadge, cells.polling);
    cells.bar = el('div', 'progress');
    cells.fill = el('div', 'progress-fill');
    cells.bar.appendChild(cells.fill);
    cells.progressText = el('span', 'progress-text');
    const wrap = el('div', 'progress-cell');
    wrap.append(cells.bar, cells.progressText);
    cells.progress.appendChild(wrap);
    for (const k of ['id', 'name', 'state', 'progress', 'rounds', 'seen', 'norm']) tr.appendChild(cells[k]);
    return {tr: tr, cells: cells};
  }

  function renderClients(status) {
    const clients = status.clients || [];
    const tbody = $('clients').tBodies[0];
    const seen = new Set();
    clients.forEach((c, i) => {
      const id = String(c.client_id || '');
      seen.add(id);
      let row = clientRows.get(id);
      if (!row) { row = makeClientRow(id); clientRows.set(id, row); }
      const cells = row.cells;
      const state = String(c.state || '');
      setNodeText(cells.id, id);
      setNodeText(cells.name, c.display_name ? String(c.display_name) : '—');
      setNodeText(cells.stateBadge, state || '?');
      cells.stateBadge.className = 'badge state-' + (CLIENT_STATES.includes(state) ? state : 'other');
      setNodeText(cells.polling, c.polling ? ' polling' : '');
      const done = num(c.batches_done);
      const total = num(c.batches_total);
      const busy = (state === 'training' || state === 'evaluating') && total > 0;
      cells.bar.hidden = !busy;
      cells.fill.style.width = busy ? Math.min(100, done / total * 100).toFixed(1) + '%' : '0%';
      cells.fill.className = 'progress-fill' + (state === 'evaluating' ? ' eval' : '');
      setNodeText(cells.progressText, busy ? fmtInt(done) + ' / ' + fmtInt(total) : '—');
      setNodeText(cells.rounds, String(num(c.rounds_contributed)));
      setNodeText(cells.seen, fmtAgo(c.last_seen_ms_ago));
      setNodeText(cells.norm, num(c.last_update_round) > 0 && !status.privacy
        ? fmtSig(c.last_update_norm) + ' (round ' + num(c.last_update_round) + ')' : '—');
      row.tr.classList.toggle('gone', state === 'gone');
      if (tbody.children[i] !== row.tr) tbody.insertBefore(row.tr, tbody.children[i] || null);
    });
    for (const [id, row] of clientRows) {
      if (!seen.has(id)) { row.tr.remove(); clientRows.delete(id); }
    }
    $('clients-empty').hidden = clients.length > 0;
    const counts = status.client_counts || {};
    setText('clients-summary', ['evaluating', 'gone', 'ready', 'training']
      .filter(k => num(counts[k]) > 0).map(k => fmtInt(num(counts[k])) + ' ' + k).join(' · '));
    // The pager: the page tokens seen so far, the first page's being empty.
    const next = String(status.next_client_page_token || '');
    clientPages.length = clientPage + 1;
    if (next) clientPages.push(next);
    const first = clientPage === 0 ? 0 : Number(clientPages[clientPage]);
    $('clients-pager').hidden = clientPage === 0 && !next;
    $('clients-prev').disabled = clientPage === 0;
    $('clients-next').disabled = !next;
    setText('clients-page', clients.length
      ? 'clients ' + fmtInt(first + 1) + '–' + fmtInt(first + clients.length) + ' of ' + fmtInt(num(counts.joined))
      : '');

    // The gradient queue: latest update norm of every client that has pushed one (none
    // under central DP, which does not show a client's own norm).
    const withNorm = status.privacy ? [] : clients.filter(c => num(c.last_update_round) > 0);
    const latest = withNorm.reduce((a, c) => Math.max(a, num(c.last_update_round)), 0);
    const norms = {
      id: 'last_update_norm', color: COLORS.normLatest,
      values: withNorm.map(c => num(c.last_update_norm)),
      colors: withNorm.map(c => num(c.last_update_round) === latest ? COLORS.normLatest : COLORS.normOlder),
      titles: withNorm.map(c => (c.display_name ? c.display_name + ' (' + c.client_id + ')' : String(c.client_id)) +
        ' · ‖Δ‖₂ = ' + fmtSig(c.last_update_norm) + ' at round ' + num(c.last_update_round)),
    };
    const labels = withNorm.map(c => String(c.display_name || c.client_id));
    const legend = [
      {label: latest ? 'round ' + latest : 'latest round', color: COLORS.normLatest, kind: 'box'},
      {label: 'older rounds', color: COLORS.normOlder, kind: 'box',
       dim: !withNorm.some(c => num(c.last_update_round) !== latest)},
    ];
    drawIfChanged('plot-norms', JSON.stringify([labels, norms, legend]), svg => drawBarChart(svg, {
      height: 240, categories: labels, series: [norms], legend: legend, xLabel: 'client', yLabel: 'L2 norm of update',
      yFormat: (v, step) => step >= 1 ? String(v) : v.toFixed(Math.min(4, -Math.floor(Math.log10(step)))),
      emptyText: status.privacy ? 'not shown under differential privacy'
        : 'no client has pushed an update yet',
    }));
    if (withNorm.length) {
      const vals = norms.values;
      const mean = vals.reduce((a, v) => a + v, 0) / vals.length;
      setText('norms-summary', withNorm.length + ' clients · mean ' + fmtSig(mean) + ' · max ' +
        fmtSig(Math.max.apply(null, vals)));
    } else {
      setText('norms-summary', '');
    }
  }

  // Central DP: epsilon after every released round, against the budget.
  function renderPrivacy(status) {
    const p = status.privacy;
    $('privacy').hidden = !p;
    if (!p) return;
    const released = (status.history || []).filter(r => isTrainingRecord(r) && num(r.dp_noise_multiplier) > 0);
    const budget = num(p.max_epsilon);
    const series = [
      {id: 'dp_epsilon', label: 'ε at δ = ' + fmtSig(p.delta), color: COLORS.epsilon,
       points: released.map(r => ({x: num(r.round), y: num(r.dp_epsilon),
         title: recordTitle(r) + ' · ε ' + fmtSig(r.dp_epsilon) + ' · q ' + fmtSig(r.dp_sampling_rate) +
           ', z ' + fmtSig(r.dp_noise_multiplier)}))},
      {id: 'dp_budget', label: 'budget', color: COLORS.budget, dash: true, points: [],
       hline: budget > 0 ? {y: budget, text: 'budget ε ' + fmtSig(budget),
                            title: 'training stops before a round would pass ε = ' + fmtSig(budget)} : null},
    ];
    drawIfChanged('plot-epsilon', JSON.stringify(series), svg => drawLinePlot(svg, {
      height: 240, xLabel: 'round', yLabel: 'ε spent', includeZero: true, series: series,
      yFormat: (v, step) => step >= 1 ? String(v) : v.toFixed(Math.min(4, -Math.floor(Math.log10(step)))),
      emptyText: 'no private round released yet',
    }));
    setText('dp-epsilon', fmtSig(p.epsilon));
    setText('privacy-summary', num(p.rounds) + ' rounds · noise multiplier z ' + fmtSig(p.noise_multiplier) +
      ' · clip norm C ' + fmtSig(p.clip_norm) + (budget > 0 ? ' · budget ε ' + fmtSig(budget) : ' · no budget'));
  }

  function setNodeText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  // Each part renders on its own, so a surprise in one part of the document leaves the
  // others live.
  function renderStatus(status) {
    for (const part of [renderHeader, renderCards, renderCurves, renderRounds, renderPrivacy, renderClients]) {
      try {
        part(status);
      } catch (e) {
        console.error('fedlearn dashboard: ' + part.name + ' failed', e);
      }
    }
    document.body.dataset.statusRound = String(num(status.round));
    document.body.dataset.updated = '1';
  }

  // ---------------------------------------------------------------------------------
  // Rendering of /api/parameters.

  const tensorRows = new Map();

  function renderParameters(params) {
    const tensors = Array.isArray(params.tensors) ? params.tensors : [];
    const tbody = $('tensors').tBodies[0];
    const seen = new Set();
    let total = 0;
    tensors.forEach((t, i) => {
      const name = String(t.name || '');
      seen.add(name);
      let row = tensorRows.get(name);
      if (!row) {
        const tr = el('tr');
        tr.dataset.tensor = name;
        const cells = [el('td', 'mono'), el('td', 'mono'), el('td', 'num'), el('td', 'num'), el('td', 'num'),
                       el('td', 'num'), el('td', 'num'), el('td', 'num'), el('td', 'hist-cell')];
        const svg = svgEl('svg', {class: 'histogram', role: 'img'});
        cells[8].appendChild(svg);
        tr.append(...cells);
        row = {tr: tr, cells: cells, svg: svg, histKey: null};
        tensorRows.set(name, row);
      }
      const shape = (t.shape || []).map(num);
      total += num(t.count);
      const texts = [name, '[' + shape.join(' × ') + ']', fmtInt(t.count), fmtSig(t.l2), fmtSig(t.mean),
                     fmtSig(t.std), fmtSig(t.min), fmtSig(t.max)];
      texts.forEach((s, k) => setNodeText(row.cells[k], s));
      const key = JSON.stringify(t.histogram || null);
      if (key !== row.histKey) {
        row.histKey = key;
        drawHistogram(row.svg, t.histogram);
        row.svg.setAttribute('aria-label', 'histogram of ' + name);
      }
      if (tbody.children[i] !== row.tr) tbody.insertBefore(row.tr, tbody.children[i] || null);
    });
    for (const [name, row] of tensorRows) {
      if (!seen.has(name)) { row.tr.remove(); tensorRows.delete(name); }
    }
    $('tensors-empty').hidden = tensors.length > 0;
    if (!tensors.length) setText('tensors-empty', 'The coordinator reports no tensors.');
    setText('params-summary', tensors.length + ' tensors · ' + fmtInt(total) + ' values · after round ' +
      num(params.round));
    document.body.dataset.paramsRound = String(num(params.round));
  }

  // ---------------------------------------------------------------------------------
  // Polling.

  const errors = {status: null, parameters: null, metrics: null};
  let lastStatus = null;

  function renderConnection() {
    const conn = $('conn');
    const failing = Object.keys(errors).filter(k => errors[k]);
    if (failing.length) {
      conn.className = 'conn conn-bad';
      setNodeText(conn, 'disconnected — retrying');
      conn.title = failing.map(k => (k === 'metrics' ? '/' : '/api/') + k + ': ' + errors[k])
          .join('\n');
    } else if (lastStatus) {
      conn.className = 'conn conn-ok';
      setNodeText(conn, 'live');
      conn.title =
          'polling /api/status every 1 s, /api/parameters every 3 s and /metrics every 2 s';
    }
  }

  // The document at `url`: parsed as JSON, or with `parse` from its text.
  async function fetchDoc(url, parse) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      const resp = await fetch(url, {cache: 'no-store', signal: ctl.signal});
      if (!resp.ok) throw new Error('HTTP ' + resp.status);
      return parse ? parse(await resp.text()) : await resp.json();
    } finally {
      clearTimeout(timer);
    }
  }

  // Fetches `url` every `period` ms (measured from the start of each fetch, never two at
  // once) and hands each document to `render`.
  function poll(key, url, period, render, parse) {
    const tick = async () => {
      const started = Date.now();
      let data = null;
      try {
        data = await fetchDoc(typeof url === 'function' ? url() : url, parse);
        errors[key] = null;
      } catch (e) {
        errors[key] = e && e.name === 'AbortError' ? 'timed out' : String(e && e.message || e);
      }
      if (data) {
        try {
          render(data);
        } catch (e) {
          console.error('fedlearn dashboard: rendering ' + url + ' failed', e);
        }
      }
      renderConnection();
      setTimeout(tick, Math.max(50, period - (Date.now() - started)));
    };
    tick();
  }

  // Prometheus' text exposition as {sample name with its labels: value}.
  function parseMetrics(text) {
    const samples = {};
    for (const line of text.split('\n')) {
      if (!line || line[0] === '#') continue;
      const space = line.lastIndexOf(' ');
      samples[line.slice(0, space)] = Number(line.slice(space + 1));
    }
    return samples;
  }

  // The transfers cards: what downloads and uploads hold now, and what was cut off.
  function renderTransfers(m) {
    const get = name => m[name] || 0;
    setText('downloads', fmtInt(get('fedlearn_downloads')));
    const versions = get('fedlearn_download_versions');
    setText('downloads-sub', 'holding ' + fmtInt(versions) + ' model version' +
        (versions === 1 ? '' : 's') + ' · ' + fmtBytes(get('fedlearn_download_version_bytes')));
    setText('receive-buffers', fmtInt(get('fedlearn_receive_buffers_in_use')) + ' / ' +
        fmtInt(get('fedlearn_receive_buffers')));
    setText('receive-buffers-sub', fmtInt(get('fedlearn_uploads_waiting')) + ' uploads waiting');
    const stalled = get('fedlearn_downloads_cut_off_total{reason="stalled"}');
    const movedOn = get('fedlearn_downloads_cut_off_total{reason="moved_on"}');
    setText('downloads-cut-off', fmtInt(stalled + movedOn));
    setText('downloads-cut-off-sub', fmtInt(stalled) + ' stalled · ' + fmtInt(movedOn) +
        ' after the run moved on');
    setText('uploads-cut-off', fmtInt(get('fedlearn_updates_rejected_total{reason="too_slow"}')));
    setText('uploads-cut-off-sub', 'stalled or too slow while others waited');
    document.body.dataset.metricsUpdated = '1';
  }

  // Which page of the client list the status polls ask for (GetStatusRequest's
  // client_page_token): clientPages[clientPage].
  const clientPages = [''];
  let clientPage = 0;
  // The charts draw the latest HISTORY_SIZE records (a long async run has many more:
  // /api/history.csv has them all).
  const HISTORY_SIZE = 1000;
  function statusUrl() {
    const token = clientPages[clientPage];
    return 'api/status?history_size=' + HISTORY_SIZE +
        (token ? '&client_page_token=' + encodeURIComponent(token) : '');
  }

  function start() {
    $('clients-prev').addEventListener('click', () => { if (clientPage > 0) clientPage--; });
    $('clients-next').addEventListener('click', () => {
      if (clientPage + 1 < clientPages.length) clientPage++;
    });
    poll('status', statusUrl, STATUS_PERIOD_MS, s => {
      lastStatus = s;
      renderStatus(s);
      setText('updated-at', 'updated ' + new Date().toLocaleTimeString());
    });
    poll('parameters', 'api/parameters', PARAMS_PERIOD_MS, p => {
      renderParameters(p);
    });
    poll('metrics', 'metrics', METRICS_PERIOD_MS, renderTransfers, parseMetrics);
    let resizeTimer = null;
    window.addEventListener('resize', () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => { if (lastStatus) renderStatus(lastStatus); }, 150);
    });
  }

  start();
})();
