// flashbox dashboard: polls /v1/stats every second, shows numbers and charts. "Now" rates are
// differences of two polls over the server's uptime clock; "avg" values are the server's
// lifetime averages. Charts come from Chart.js when the build embedded it (Debian's
// libjs-chart.js), else from the small canvas drawer below.
'use strict';

const POLL_MS = 1000;
const HISTORY = 120;  // points kept per chart (two minutes)
const COLORS = ['#2563eb', '#ea580c', '#16a34a', '#9333ea'];

// ---- API key: #key=KEY in the URL (never sent to the server), else the last one used. ----
let apiKey = '';
{
  const m = /(?:^|[#&])key=([^&]*)/.exec(location.hash);
  if (m) { apiKey = decodeURIComponent(m[1]); sessionStorage.setItem('flashbox_key', apiKey); }
  else apiKey = sessionStorage.getItem('flashbox_key') || '';
}
document.getElementById('keyform').addEventListener('submit', (ev) => {
  ev.preventDefault();
  apiKey = document.getElementById('key').value;
  sessionStorage.setItem('flashbox_key', apiKey);
  document.getElementById('keyform').hidden = true;
  poll();
});

// ---- formatting ----
const NA = 'n/a';
function num(v, digits) {
  if (v === null || v === undefined || !isFinite(v)) return NA;
  if (digits === undefined) digits = Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2;
  return v.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
}
function pct(v) { return v === null || v === undefined || !isFinite(v) ? NA : (100 * v).toFixed(1) + '%'; }
function bytes(v) {
  if (v === null || v === undefined) return NA;
  const u = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (v >= 1000 && i < u.length - 1) { v /= 1000; ++i; }
  return v.toFixed(i ? 1 : 0) + ' ' + u[i];
}
function dur(s) {
  s = Math.floor(s);
  const h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60, r = s % 60;
  return (h ? h + 'h ' : '') + (h || m ? m + 'm ' : '') + r + 's';
}
function set(id, text) { document.getElementById(id).textContent = text; }
function ratio(a, b) { return b > 0 ? a / b : null; }

// ---- charts ----
// makeChart(canvas, kind, labels) -> {update(xs, series, hist)}: kind 'line' (series over time)
// or 'bar' (one series over categories).
function makeChart(canvas, kind, names) {
  if (window.Chart) {
    const c = new Chart(canvas, {
      type: kind,
      data: { labels: [], datasets: names.map((n, i) => ({ label: n, data: [], borderColor: COLORS[i], backgroundColor: COLORS[i] + (kind === 'bar' ? 'cc' : '33'),
                                                            pointRadius: 0, borderWidth: 2, tension: 0.2, yAxisID: i === 1 && kind === 'line' && names.dual ? 'y1' : 'y' })) },
      options: { animation: false, responsive: true, maintainAspectRatio: false,
                 scales: Object.assign({ x: { ticks: { maxTicksLimit: 6 } }, y: { beginAtZero: true } },
                                       names.dual ? { y1: { beginAtZero: true, position: 'right', grid: { drawOnChartArea: false } } } : {}),
                 plugins: { legend: { labels: { boxWidth: 12 } } } },
    });
    return { update(xs, series) {
      c.data.labels = xs;
      series.forEach((s, i) => { c.data.datasets[i].data = s; });
      c.update('none');
    } };
  }
  return { update(xs, series) { drawCanvas(canvas, kind, names, xs, series); } };
}

// The fallback: axes, a max label, lines or bars, a legend. Each series on its own scale when
// `names.dual` (right axis for the second).
function drawCanvas(canvas, kind, names, xs, series) {
  const dpr = window.devicePixelRatio || 1, W = canvas.clientWidth, H = canvas.clientHeight;
  canvas.width = W * dpr; canvas.height = H * dpr;
  const g = canvas.getContext('2d');
  g.scale(dpr, dpr);
  g.clearRect(0, 0, W, H);
  g.font = '11px system-ui, sans-serif';
  const L = 44, R = names.dual ? 44 : 10, T = 20, B = 18, w = W - L - R, h = H - T - B;
  const maxOf = (arr) => Math.max(1e-9, ...arr.filter((v) => v !== null && isFinite(v)));
  const scales = series.map((s, i) => (names.dual || i === 0 ? maxOf(s) : 0));
  const shared = names.dual ? null : maxOf(series.flat());
  g.strokeStyle = '#e5e7eb'; g.fillStyle = '#6b7280';
  g.beginPath(); g.moveTo(L, T); g.lineTo(L, T + h); g.lineTo(L + w, T + h); g.stroke();
  g.textAlign = 'right';
  g.fillText(num(shared !== null ? shared : scales[0]), L - 4, T + 8);
  g.fillText('0', L - 4, T + h);
  if (names.dual) { g.textAlign = 'left'; g.fillText(num(scales[1]), L + w + 4, T + 8); }
  if (xs.length) {
    g.textAlign = 'left'; g.fillText(String(xs[0]), L, H - 4);
    g.textAlign = 'right'; g.fillText(String(xs[xs.length - 1]), L + w, H - 4);
  }
  series.forEach((s, i) => {
    const top = shared !== null ? shared : scales[i];
    g.strokeStyle = g.fillStyle = COLORS[i];
    if (kind === 'bar') {
      const bw = w / Math.max(1, s.length);
      s.forEach((v, k) => { const bh = (v / top) * h; g.fillRect(L + k * bw + 2, T + h - bh, bw - 4, bh); });
      return;
    }
    g.lineWidth = 2; g.beginPath();
    let started = false;
    s.forEach((v, k) => {
      if (v === null || !isFinite(v)) return;
      const x = L + (s.length > 1 ? (k / (s.length - 1)) * w : 0), y = T + h - (v / top) * h;
      if (started) g.lineTo(x, y); else { g.moveTo(x, y); started = true; }
    });
    g.stroke();
  });
  let x = L;
  g.textAlign = 'left';
  names.forEach((n, i) => { g.fillStyle = COLORS[i]; g.fillRect(x, 4, 10, 10); g.fillStyle = '#1d2330'; g.fillText(n, x + 14, 13); x += 24 + g.measureText(n).width; });
}

const dualNames = (a) => Object.assign(a, { dual: true });
const charts = {
  tok: makeChart(document.getElementById('c_tok'), 'line', ['decode', 'prefill']),
  step: makeChart(document.getElementById('c_step'), 'line', dualNames(['step ms', 'rows / step'])),
  sess: makeChart(document.getElementById('c_sess'), 'line', ['active', 'queued']),
  accept: makeChart(document.getElementById('c_accept'), 'bar', ['rounds']),
};
set('charts_by', window.Chart ? 'Chart.js ' + (Chart.version || '') + ' (embedded from Debian libjs-chart.js)' : 'built-in canvas drawer (this build has no Chart.js)');

// ---- breakdowns: a stacked bar and a table (step time by op family, expert bytes by tier) ----
const OP_FAMILIES = [['embed', 'embed'], ['engram', 'Engram'], ['mhc', 'mHC mixes, collapse, expand'], ['attn_proj', 'attention projections'],
                     ['index', 'compressor + indexer'], ['attention', 'attention'], ['moe', 'MoE'], ['head', 'head'], ['other', 'other']];
const OP_COLORS = ['#94a3b8', '#0d9488', '#9333ea', '#2563eb', '#db2777', '#16a34a', '#ea580c', '#ca8a04', '#6b7280'];
const TIERS = [['hbm', 'HBM'], ['host', 'host RAM'], ['drive', 'drives']];
const TIER_COLORS = ['#16a34a', '#2563eb', '#ea580c'];

// rows: [{key, name, color, value, cells: [text...]}]; the bar's segments are value shares; each
// cell gets the id PREFIX_KEY_N (N = column) for tests and scripts.
function breakdown(stackId, tableId, prefix, rows, nCols) {
  const total = rows.reduce((a, r) => a + (r.value > 0 ? r.value : 0), 0);
  const stack = document.getElementById(stackId);
  stack.textContent = '';
  const body = document.querySelector('#' + tableId + ' tbody');
  body.textContent = '';
  if (!rows.length) { body.innerHTML = '<tr><td colspan="' + nCols + '" class="muted">n/a</td></tr>'; return; }
  for (const r of rows) {
    if (total > 0 && r.value > 0) {
      const seg = document.createElement('div');
      seg.style.width = (100 * r.value / total).toFixed(2) + '%';
      seg.style.background = r.color;
      seg.title = r.name;
      stack.appendChild(seg);
    }
    const tr = document.createElement('tr');
    const name = document.createElement('td');
    name.className = 'name';
    name.innerHTML = '<i></i>';
    name.firstChild.style.background = r.color;
    name.appendChild(document.createTextNode(r.name));
    tr.appendChild(name);
    const cells = [...r.cells.slice(0, 1), total > 0 ? pct(r.value / total) : NA, ...r.cells.slice(1)];
    cells.forEach((v, i) => {
      const td = document.createElement('td'); td.id = prefix + '_' + r.key + '_' + (i + 1); td.textContent = v; tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}

// Op families: ms per step over the last poll interval when steps ran in it, else since start.
function renderOps(s) {
  const o = s.op_time;
  if (!o) { set('op_window', NA); breakdown('op_stack', 'op_table', 'op', [], 3); return; }
  let steps = o.steps, secs = o.seconds, win = 'since start';
  if (prev && prev.op_time && o.steps > prev.op_time.steps) {
    steps = o.steps - prev.op_time.steps;
    secs = Object.fromEntries(OP_FAMILIES.map(([k]) => [k, o.seconds[k] - prev.op_time.seconds[k]]));
    win = 'last ' + num(s.uptime_s - prev.uptime_s, 1) + ' s';
  }
  set('op_window', win + ', ' + num(steps, 0) + ' steps');
  breakdown('op_stack', 'op_table', 'op', steps > 0 ? OP_FAMILIES.map(([k, n], i) => {
    const ms = (1e3 * secs[k]) / steps;
    return { key: k, name: n, color: OP_COLORS[i], value: ms, cells: [num(ms, ms >= 100 ? 0 : ms >= 1 ? 2 : 3)] };
  }) : [], 3);
}

// Expert tiers: bytes per token (rows of the steps) and hit rates over the last poll interval
// when lookups happened in it, else since start.
function renderTiers(s) {
  const x = s.expert_traffic;
  if (!x) { set('tier_window', NA); breakdown('tier_stack', 'tier_table', 'tier', [], 5); return; }
  let cur = x, rows = s.steps.rows, win = 'since start';
  const looks = (t) => t.hbm.lookups + t.host.lookups + t.drive.lookups;
  if (prev && prev.expert_traffic && looks(x) > looks(prev.expert_traffic) && s.steps.rows > prev.steps.rows) {
    const p = prev.expert_traffic;
    cur = Object.fromEntries(TIERS.map(([k]) => [k, { lookups: x[k].lookups - p[k].lookups, bytes: x[k].bytes - p[k].bytes }]));
    rows = s.steps.rows - prev.steps.rows;
    win = 'last ' + num(s.uptime_s - prev.uptime_s, 1) + ' s';
  }
  set('tier_window', win + ', ' + num(rows, 0) + ' tokens');
  const all = looks(cur), reach = [all, cur.host.lookups + cur.drive.lookups, cur.drive.lookups];
  breakdown('tier_stack', 'tier_table', 'tier', rows > 0 ? TIERS.map(([k, n], i) => ({
    key: k, name: n, color: TIER_COLORS[i], value: cur[k].bytes / rows,
    cells: [bytes(cur[k].bytes / rows), num(cur[k].lookups, 0), i < 2 ? pct(ratio(cur[k].lookups, reach[i])) : NA],
  })) : [], 5);
}

// Engram rows: the shares hidden (fetched before their layer), exposed (the layer waited) and
// read in place, rows per token and the wait per step, over the last poll interval when steps
// read rows in it, else since start.
function renderEngram(s) {
  const e = s.engram;
  const ids = ['v_engram_hidden', 'v_engram_exposed', 'v_engram_in_place', 'v_engram_rows_tok', 'v_engram_wait_ms'];
  if (!e) { ids.forEach((id) => set(id, NA)); return; }
  let cur = e, rows = s.steps.rows, steps = s.steps.count;
  if (prev && prev.engram && e.rows > prev.engram.rows && s.steps.rows > prev.steps.rows) {
    const p = prev.engram;
    cur = Object.fromEntries(['rows', 'hidden', 'exposed', 'in_place', 'exposed_s'].map((k) => [k, e[k] - p[k]]));
    rows = s.steps.rows - prev.steps.rows;
    steps = s.steps.count - prev.steps.count;
  }
  set('v_engram_hidden', pct(ratio(cur.hidden, cur.rows)));
  set('v_engram_exposed', pct(ratio(cur.exposed, cur.rows)));
  set('v_engram_in_place', pct(ratio(cur.in_place, cur.rows)));
  set('v_engram_rows_tok', num(ratio(cur.rows, rows)));
  set('v_engram_wait_ms', num(ratio(1e3 * cur.exposed_s, steps), 3));
}

// One tier of the executor's memory ledger (s.memory.hbm or .host): its total and its parts into
// the ids v_mem_TIER, v_mem_TIER_PART and v_mem_TIER_n_sessions; "n/a" when the tier is null.
const MEM_PARTS = ['weights', 'weight_copies', 'sessions', 'scratch', 'experts'];
function renderTierMemory(tier, t) {
  const id = 'v_mem_' + tier;
  set(id, t ? bytes(t.total_bytes) : NA);
  for (const p of MEM_PARTS) set(id + '_' + p, t ? bytes(t[p + '_bytes']) : NA);
  set(id + '_n_sessions', t ? num(t.sessions, 0) : NA);
}

// ---- polling ----
const hist = { t: [], decode: [], prefill: [], step: [], rows: [], active: [], queued: [] };
let prev = null, updates = 0;

function push(key, v) { hist[key].push(v); if (hist[key].length > HISTORY) hist[key].shift(); }

function render(s) {
  const d = s.derived;
  let decodeNow = null, prefillNow = null, stepNow = d.step_ms, rowsNow = d.rows_per_step;
  if (prev && s.uptime_s > prev.uptime_s) {
    const dt = s.uptime_s - prev.uptime_s, dsteps = s.steps.count - prev.steps.count;
    decodeNow = (s.tokens.emitted - prev.tokens.emitted) / dt;
    prefillNow = (s.steps.prefill_rows - prev.steps.prefill_rows) / dt;
    if (dsteps > 0) {
      stepNow = (1e3 * (s.steps.seconds - prev.steps.seconds)) / dsteps;
      rowsNow = (s.steps.rows - prev.steps.rows) / dsteps;
    }
  }
  set('model', s.model); set('backend', s.backend); set('uptime', dur(s.uptime_s));
  set('v_decode_tok_s', num(decodeNow)); set('v_decode_tok_s_avg', num(d.decode_tok_s));
  set('v_prefill_tok_s', num(prefillNow)); set('v_prefill_tok_s_avg', num(d.prefill_tok_s));
  set('v_step_ms', num(stepNow)); set('v_steps', num(s.steps.count, 0));
  set('v_rows_per_step', num(rowsNow)); set('v_sessions_per_step', num(d.sessions_per_step));
  set('v_queued', num(s.requests.queued, 0)); set('v_active', num(s.requests.active, 0)); set('v_max_sessions', num(s.requests.max_sessions, 0));
  set('v_ttft_ms', num(d.ttft_ms)); set('v_queue_wait_ms', num(d.queue_wait_ms));
  set('v_emitted', num(s.tokens.emitted, 0)); set('v_prompt', num(s.tokens.prompt, 0)); set('v_requests', num(s.requests.total, 0));
  set('v_dspark_len', num(d.dspark_tokens_per_round)); set('v_dspark_rate', pct(d.dspark_accept_rate));
  set('v_dspark_backoff', s.dspark ? num(s.dspark.backoff_steps, 0) : NA);
  set('v_kv_hit_rate', pct(d.kv_cache_hit_rate)); set('v_kv_hits', s.kv_cache ? num(s.kv_cache.hits, 0) : NA);
  set('v_kv_restored', s.kv_cache ? num(s.tokens.kv_restored, 0) : NA);
  const x = s.expert_traffic, bpt = d.expert_bytes_per_token;
  set('v_slot_hit_rate', pct(d.expert_hbm_hit_rate)); set('v_host_hit_rate', pct(d.expert_host_tier_hit_rate));
  set('v_bpt_total', bpt && bpt.hbm !== null ? bytes(bpt.hbm + bpt.host + bpt.drive) : NA);
  set('v_bpt_drive_card', bpt && bpt.drive !== null ? bytes(bpt.drive) : NA);
  set('v_drive_reads', x ? num(x.drive.lookups, 0) : NA);
  set('v_drive_bytes', x ? bytes(x.drive.bytes) : NA);
  renderOps(s);
  renderTiers(s);
  renderEngram(s);
  // The memory ledger: the executor's own bytes by tier (s.memory; a tier it does not report is
  // null: "n/a"), the KV admission ledger (s.ledger, --kv-budget-bytes) beside them as used / target.
  const led = (t) => (t ? bytes(t.mandatory_bytes + t.elastic_bytes) + ' / ' + bytes(t.target_bytes) : NA);
  const mem = s.memory || {};
  renderTierMemory('hbm', mem.hbm);
  renderTierMemory('host', mem.host);
  set('v_ledger_hbm', led(s.ledger.HBM));
  set('v_ledger_host', led(s.ledger.host));
  set('v_mem_drive', mem.drive ? bytes(mem.drive.expert_bytes_read + (mem.drive.engram_bytes_read || 0)) : NA);

  push('t', s.uptime_s < 600 ? s.uptime_s.toFixed(1) + 's' : dur(s.uptime_s)); push('decode', decodeNow); push('prefill', prefillNow);
  push('step', stepNow); push('rows', rowsNow); push('active', s.requests.active); push('queued', s.requests.queued);
  charts.tok.update(hist.t.slice(), [hist.decode.slice(), hist.prefill.slice()]);
  charts.step.update(hist.t.slice(), [hist.step.slice(), hist.rows.slice()]);
  charts.sess.update(hist.t.slice(), [hist.active.slice(), hist.queued.slice()]);
  const ah = s.dspark ? s.dspark.accepted_hist : [];
  charts.accept.update(ah.map((_, i) => String(i)), [ah]);

  const body = document.querySelector('#sessions tbody');
  body.textContent = '';
  if (!s.sessions.length) body.innerHTML = '<tr><td colspan="5" class="muted">none</td></tr>';
  for (const r of s.sessions) {
    const tr = document.createElement('tr');
    const prog = r.prefill_total > 0 ? num(r.prefill_done, 0) + ' / ' + num(r.prefill_total, 0) : NA;
    for (const v of [String(r.id), num(r.tokens, 0), num(r.tok_s), prog, num(r.prefill_tok_s)]) {
      const td = document.createElement('td'); td.textContent = v; tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  prev = s;
  set('updates', String(++updates));
}

async function poll() {
  try {
    const headers = apiKey ? { Authorization: 'Bearer ' + apiKey } : {};
    const r = await fetch('/v1/stats', { headers, cache: 'no-store' });
    if (r.status === 401) {
      document.body.dataset.state = 'error';
      set('status', 'API key needed');
      document.getElementById('keyform').hidden = false;
      return;  // resumes when a key is entered
    }
    if (!r.ok) throw new Error('HTTP ' + r.status);
    render(await r.json());
    document.body.dataset.state = 'live';
    set('status', 'live');
  } catch (e) {
    document.body.dataset.state = 'error';
    set('status', 'no connection (' + e.message + ')');
  }
  setTimeout(poll, POLL_MS);
}
poll();
