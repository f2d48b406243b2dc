"use strict";
// The records viewer. The index is drawn from the small summaries at once; a group's data (a
// base64 deflate blob in <script id="g<N>">, laid out as opd/records/viewer/payload.py says) is
// inflated and drawn only when it is opened, so a page of 10,000 groups opens as fast as one.
(() => {
  const $ = (id) => document.getElementById(id);
  const VOCAB = JSON.parse($("vocabulary").textContent);
  const SUMMARY = JSON.parse($("summary").textContent);
  const COL = Object.fromEntries(SUMMARY.columns.map((name, i) => [name, i]));
  const ROWS = SUMMARY.rows;
  const NO_LOGPROB = -2147483648; // payload.NO_LOGPROB: a null teacher logprob
  const PAGE_SIZE = 100;
  const ARRAY_TYPES = { u2: Uint16Array, u4: Uint32Array, i4: Int32Array };
  const KIND = ["prompt", "generated", "inserted"];
  // [summary column, heading, numeric, what it is]
  const INDEX_COLUMNS = [
    ["group", "#", true, "line of the file (from 0)"], ["item", "item", false, "item id"], ["env", "env", false, "environment"],
    ["score_mean", "score", true, "mean score of the group's rollouts"], ["score_std", "sd", true, "spread: standard deviation of the scores"],
    ["passed", "pass", true, "rollouts that passed (the rubric's pass rule, as each record says)"],
    ["failed", "fail", true, "rollouts that did not pass"], ["hinted_turns", "hints", true, "judged turns with a hint"],
    ["format_violations", "fmt", true, "rollouts with a format violation"], ["tool_calls", "tools", true, "tool calls"],
    ["tool_errors", "errs", true, "tool errors"],
  ];
  // OPD data (judged turns, teacher rows): its controls are shown only where a group has it.
  const hasOPD = (row) => row[COL.judged_turns] > 0 || row[COL.scored_turns] > 0;
  const PAGE_OPD = ROWS.some(hasOPD);
  if (!PAGE_OPD) INDEX_COLUMNS.splice(INDEX_COLUMNS.findIndex(([name]) => name === "hinted_turns"), 1);
  const state = { filter: "all", env: "", search: "", sort: "group", desc: false, page: 0, list: ROWS, group: null, rollout: null };
  const cache = new Map(); // group index -> unpacked data (the last few opened)
  let view = null; // the open rollout's per-position arrays, for the token popup
  let opening = 0; // bumped on each open, so a slow inflate cannot draw over a later choice

  // ---- text ------------------------------------------------------------------------------
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const num = (x, digits = 3) => (typeof x !== "number" ? (x === null || x === undefined ? "–" : String(x)) : Number.isInteger(x) ? String(x) : x.toFixed(digits));
  const signed = (x) => (x >= 0 ? "+" : "−") + Math.abs(x).toFixed(3);
  const piece = (id) => (VOCAB[id] === undefined || VOCAB[id] === null ? `⟨${id}⟩` : VOCAB[id]);
  // In the token flow newlines still break lines; in lists every invisible character is drawn.
  const flowText = (s) => (s === "" ? "∅" : s.replace(/\n/g, "↵\n"));
  const listText = (s) => (s === "" ? "∅" : s.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "⇥"));
  const json = (x) => esc(JSON.stringify(x));

  // ---- index -----------------------------------------------------------------------------
  function matches(row) {
    if (state.env && row[COL.env] !== state.env) return false;
    if (state.search && !row[COL.item].toLowerCase().includes(state.search)) return false;
    if (state.filter === "hints") return row[COL.hinted_turns] > 0;
    if (state.filter === "failed") return row[COL.failed] > 0;
    if (state.filter === "format") return row[COL.format_violations] > 0;
    return true;
  }

  function relist() {
    const c = COL[state.sort];
    const sign = state.desc ? -1 : 1;
    state.list = ROWS.filter(matches).sort((a, b) => {
      const order = a[c] < b[c] ? -1 : a[c] > b[c] ? 1 : 0;
      return order ? order * sign : a[COL.group] - b[COL.group];
    });
    state.page = 0;
  }

  function indexCell(row, [name, , numeric]) {
    const v = row[COL[name]];
    if (name === "passed") return `<td class="num">${v}/${row[COL.rollouts]}</td>`;
    if (name === "score_std") return `<td class="num" title="min ${num(row[COL.score_min])} · max ${num(row[COL.score_max])}">${num(v)}</td>`;
    const flag = (name === "failed" || name === "format_violations" || name === "tool_errors") && v > 0 ? " bad" : name === "hinted_turns" && v > 0 ? " good" : "";
    if (name === "item") return `<td class="item" title="${esc(v)}">${esc(v)}</td>`;
    if (name === "hinted_turns" && !hasOPD(row)) return '<td class="num muted" title="no OPD data in this group">–</td>';
    return `<td class="${numeric ? "num" : ""}${flag}">${esc(num(v))}</td>`;
  }

  function drawIndex() {
    $("index-head").innerHTML = "<tr>" + INDEX_COLUMNS.map(([name, label, numeric, what]) =>
      `<th data-sort="${name}" title="${what}" class="${numeric ? "num" : ""}${state.sort === name ? " sorted" + (state.desc ? " desc" : "") : ""}">${label}</th>`).join("") + "</tr>";
    const pages = Math.max(1, Math.ceil(state.list.length / PAGE_SIZE));
    state.page = Math.min(state.page, pages - 1);
    const rows = state.list.slice(state.page * PAGE_SIZE, (state.page + 1) * PAGE_SIZE);
    $("index-rows").innerHTML = rows.map((row) =>
      `<tr data-g="${row[COL.group]}"${row[COL.group] === state.group ? ' class="open"' : ""}>` + INDEX_COLUMNS.map((c) => indexCell(row, c)).join("") + "</tr>").join("")
      || `<tr><td colspan="${INDEX_COLUMNS.length}" class="empty">no group matches</td></tr>`;
    $("page").textContent = `${state.list.length} of ${ROWS.length} · page ${state.page + 1}/${pages}`;
  }

  // ---- a group's data ----------------------------------------------------------------------
  function blobReady(g) {
    // While the page still loads, a blob is complete once the parser has moved past it.
    const next = ROWS.findIndex((row) => row[COL.group] === g) + 1;
    return document.readyState !== "loading" || (next < ROWS.length && $("g" + ROWS[next][COL.group]) !== null);
  }

  async function inflate(base64) {
    const binary = atob(base64);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer();
  }

  function unpack(buffer) {
    const bytes = new Uint8Array(buffer);
    const metaAt = new DataView(buffer).getUint32(0, true);
    const meta = JSON.parse(new TextDecoder().decode(bytes.subarray(metaAt)));
    for (const seq of meta.sequences) {
      seq.a = {};
      for (const [name, [type, offset, length]] of Object.entries(seq.arrays)) {
        // Stored byte plane by byte plane (payload.byte_planes): interleave them back.
        const Type = ARRAY_TYPES[type];
        const size = Type.BYTES_PER_ELEMENT;
        const out = new Uint8Array(length * size);
        for (let b = 0; b < size; b++) {
          const plane = bytes.subarray(offset + b * length, offset + (b + 1) * length);
          for (let i = 0; i < length; i++) out[i * size + b] = plane[i];
        }
        seq.a[name] = new Type(out.buffer);
      }
    }
    return meta;
  }

  async function loadGroup(g) {
    if (cache.has(g)) return cache.get(g);
    if (!blobReady(g)) await new Promise((done) => document.addEventListener("DOMContentLoaded", done, { once: true }));
    const element = $("g" + g);
    if (!element) throw new Error(`group ${g} is not in this page`);
    const data = unpack(await inflate(element.textContent));
    cache.set(g, data);
    if (cache.size > 16) cache.delete(cache.keys().next().value);
    return data;
  }

  // ---- a group -------------------------------------------------------------------------------
  const summaryOf = (g) => ROWS.find((row) => row[COL.group] === g);
  // Whether a rollout passed, as its record says (`passed`, any environment); older records: inline_math's `correct`, opd_coding's tests.
  const passedOf = (env, d) => (typeof d.passed === "boolean" ? d.passed
    : env === "inline_math" && "correct" in d ? !!d.correct : env === "opd_coding" && "tests" in d ? d.tests === "pass" : null);
  // A record's fields are read as the format says only when they have its types (a hostile or
  // foreign file may hold anything): lists must be arrays, counts numbers; every value shown is escaped.
  const list = (x) => (Array.isArray(x) ? x : []);
  const obj = (x) => (x !== null && typeof x === "object" && !Array.isArray(x) ? x : {});
  const toolCallsOf = (d) => (typeof d.tool_calls === "number" ? d.tool_calls : list(d.tools_used).length);
  const turnsOf = (d) => list(d.opd_turns).filter((t) => t !== null && typeof t === "object");
  const spanOf = (t) => (Array.isArray(t.span) && t.span.length === 2 ? t.span : [null, null]);

  function setHash(g, r, p) {
    const parts = [`g=${g}`];
    if (r !== null && r !== undefined) parts.push(`r=${r}`);
    if (p !== null && p !== undefined) parts.push(`p=${p}`);
    try {
      history.replaceState(null, "", "#" + parts.join("&"));
    } catch (err) {
      // A sandboxed frame (MLflow shows HTML artifacts in one) may refuse; the view works anyway.
    }
  }

  async function openGroup(g, then) {
    const ticket = ++opening;
    state.group = g;
    state.rollout = null;
    hidePopup();
    document.querySelectorAll("#index-rows tr.open").forEach((tr) => tr.classList.remove("open"));
    document.querySelector(`#index-rows tr[data-g="${g}"]`)?.classList.add("open");
    $("detail").innerHTML = `<p class="empty">${blobReady(g) ? "inflating" : "the page is still reading its data; then inflating"} group ${g}…</p>`;
    let data;
    try {
      data = await loadGroup(g);
    } catch (err) {
      if (ticket === opening) $("detail").innerHTML = `<p class="empty bad">could not read group ${g}: ${esc(err.message)}</p>`;
      return;
    }
    if (ticket !== opening) return;
    drawGroup(g, data);
    setHash(g);
    if (then) then(data);
  }

  function drawGroup(g, data) {
    const row = summaryOf(g);
    const env = row[COL.env];
    const go = obj(data.group_overrides);
    const facts = [["item", go.item_id], ["env", env]];
    if ("answer" in go) facts.push(["answer", go.answer]);
    for (const [k, v] of Object.entries(go)) if (k !== "item_id" && k !== "answer") facts.push([k, typeof v === "object" ? JSON.stringify(v) : v]);
    facts.push(["scores", data.sequences.map((s) => num(s.score)).join(", ")], ["generation", JSON.stringify(data.generation_params)]);
    const opd = hasOPD(row);
    const rollouts = data.sequences.map((s, r) => {
      const d = obj(s.details);
      const ok = passedOf(env, d);
      const turns = turnsOf(d);
      return `<tr data-r="${r}"><td class="num">${r}</td><td class="num">${esc(num(s.score))}</td>` +
        `<td class="${ok === true ? "good" : ok === false ? "bad" : ""}">${ok === null ? "–" : ok ? "yes" : "no"}${d.tests ? ` (${esc(d.tests)})` : ""}</td>` +
        `<td>${esc(d.finish ?? "–")}</td><td class="num">${esc(toolCallsOf(d))}</td><td class="num${d.tool_errors ? " bad" : ""}">${esc(num(d.tool_errors ?? 0))}</td>` +
        (opd ? `<td class="num">${turns.filter((t) => t.hint).length}/${turns.length}</td>` : "") + `<td class="num">${esc(num(d.generated_tokens ?? "–"))}</td></tr>`;
    }).join("");
    $("detail").innerHTML =
      `<h2>group ${g} · ${esc(go.item_id ?? "")}</h2><dl class="kv">${facts.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(num(v))}</dd>`).join("")}</dl>` +
      `<h3>Rollouts</h3><table class="rollouts"><thead><tr><th class="num">#</th><th class="num">score</th><th>passed</th><th>finish</th>` +
      `<th class="num">tool calls</th><th class="num">tool errors</th>${opd ? '<th class="num">hinted/judged turns</th>' : ""}<th class="num">generated tokens</th></tr></thead>` +
      `<tbody>${rollouts}</tbody></table><div id="rollout"></div>`;
    $("detail").querySelector(".rollouts tbody").addEventListener("click", (e) => {
      const tr = e.target.closest("tr[data-r]");
      if (tr) openRollout(data, Number(tr.dataset.r));
    });
  }

  // ---- a rollout -----------------------------------------------------------------------------
  function positions(seq, scales) {
    // Per position: kind (0 prompt, 1 generated, 2 inserted), the student's and teacher's
    // logprobs, and where its top-K row starts in the flat row arrays.
    const a = seq.a;
    const n = a.tokens.length;
    const kind = new Uint8Array(n);
    const student = new Float64Array(n).fill(NaN);
    const runs = a.generated;
    // Masked positions after the first sampled token were inserted by the environment.
    for (let p = runs.length ? runs[0] : n; p < n; p++) kind[p] = 2;
    let k = 0;
    for (let j = 0; j < runs.length; j += 2) for (let p = runs[j]; p < runs[j + 1]; p++) { kind[p] = 1; student[p] = a.student[k++] / scales.student; }
    const rowAt = new Int32Array(n).fill(-1);
    const rowStart = new Uint32Array(a.rows.length + 1);
    for (let j = 0; j < a.rows.length; j++) { rowAt[a.rows[j]] = j; rowStart[j + 1] = rowStart[j] + a.row_sizes[j]; }
    return { a, n, kind, student, rowAt, rowStart, scales };
  }

  const teacherAt = (v, p) => (v.rowAt[p] < 0 || v.a.teacher[v.rowAt[p]] === NO_LOGPROB ? null : v.a.teacher[v.rowAt[p]] / v.scales.teacher);

  function colour(advantage) {
    const t = Math.min(Math.abs(advantage) / 3, 1);
    return advantage >= 0 ? `rgba(20,150,60,${(0.12 + 0.7 * t).toFixed(2)})` : `rgba(200,30,30,${(0.12 + 0.7 * t).toFixed(2)})`;
  }

  function turnLabel(turn, j) {
    const votes = list(turn.votes).map((v) => (v === null ? "?" : v > 0 ? "+1" : "−1")).join(" ");
    return `turn ${j} · votes [${votes}] → ${turn.decision === null || turn.decision === undefined ? "none" : turn.decision > 0 ? "+1" : "−1"}` +
      (turn.hint ? ` · hint${turn.scored ? ", scored" : ", not scored"}` : "") + (turn.error ? " · error" : "");
  }

  function drawTokens(v, turns) {
    const marks = new Map(turns.map((turn, j) => [spanOf(turn)[0], j]));
    const parts = [];
    for (let p = 0; p < v.n; p++) {
      if (marks.has(p)) {
        const j = marks.get(p);
        parts.push(`<span class="turnmark${turns[j].hint ? " hinted" : ""}" id="turn-${j}" title="${esc(turns[j].hint || "no hint")}">${esc(turnLabel(turns[j], j))}</span>\n`);
      }
      const id = v.a.tokens[p];
      const head = `pos ${p} · id ${id}`;
      let cls = KIND[v.kind[p]];
      let title;
      let style = "";
      const teacher = teacherAt(v, p);
      if (v.kind[p] === 0) title = `${head} · prompt (masked)`;
      else if (v.kind[p] === 2) title = `${head} · inserted, not sampled (masked)`;
      else title = `${head} · student ${v.student[p].toFixed(3)}`;
      if (v.rowAt[p] >= 0) {
        cls += " scored";
        if (teacher !== null && !Number.isNaN(v.student[p])) {
          const advantage = teacher - v.student[p];
          style = ` style="background:${colour(advantage)}"`;
          title = `${head} · teacher ${teacher.toFixed(3)} · student ${v.student[p].toFixed(3)} · A ${signed(advantage)} · click for the teacher's top-K`;
        } else title += " · click for the teacher's top-K";
      }
      parts.push(`<span class="t ${cls}" data-p="${p}"${style} title="${esc(title)}">${esc(flowText(piece(id)))}</span>`);
    }
    return parts.join("");
  }

  function drawMessages(messages, turns) {
    return list(messages).map((m, i) => {
      if (m === null || typeof m !== "object") m = { role: "?", content: m };
      const judged = turns.map((turn, j) => [turn, j]).filter(([turn]) => turn.message_index === i);
      const boxes = judged.map(([turn, j]) =>
        `<div class="judge${turn.hint ? " hinted" : ""}"><a data-turn="${j}">${esc(turnLabel(turn, j))}</a>` +
        (turn.hint ? `<div class="hint"><b>hint:</b> ${esc(turn.hint)}</div>` : "") + (turn.error ? `<div class="bad">${esc(turn.error)}</div>` : "") + "</div>").join("");
      return `<div class="msg ${esc(m.role)}"><div class="role">${i} · ${esc(m.role)}</div><pre>${esc(typeof m.content === "string" ? m.content : JSON.stringify(m.content))}</pre>${boxes}</div>`;
    }).join("");
  }

  function drawTurnsTable(turns) {
    if (!turns.length) return "";
    return `<h3>Judged turns</h3><table class="turns"><thead><tr><th class="num">#</th><th class="num">message</th><th>span</th><th>votes</th><th>decision</th>` +
      `<th>hint</th><th>scored</th><th>error</th></tr></thead><tbody>` + turns.map((t, j) =>
        `<tr><td class="num"><a data-turn="${j}">${j}</a></td><td class="num">${esc(t.message_index ?? "–")}</td><td>[${esc(spanOf(t)[0])}, ${esc(spanOf(t)[1])})</td>` +
        `<td>${json(t.votes)}</td><td>${esc(num(t.decision))}</td><td><div class="clamp" title="${esc(t.hint || "")}">${t.hint ? esc(t.hint) : "–"}</div></td>` +
        `<td class="${t.scored ? "good" : ""}">${t.scored ? "yes" : "no"}</td><td class="${t.error ? "bad" : ""}"><div class="clamp">${t.error ? esc(t.error) : "–"}</div></td></tr>`).join("") + "</tbody></table>";
  }

  function openRollout(data, r, position) {
    const g = state.group;
    const env = summaryOf(g)[COL.env];
    const seq = data.sequences[r];
    const d = obj(seq.details);
    state.rollout = r;
    hidePopup();
    document.querySelectorAll(".rollouts tr.open").forEach((tr) => tr.classList.remove("open"));
    document.querySelector(`.rollouts tr[data-r="${r}"]`)?.classList.add("open");
    view = positions(seq, data.scales);
    view.opd = hasOPD(summaryOf(g));
    const turns = turnsOf(d);
    const ok = passedOf(env, d);
    const facts = [["score", num(seq.score)], ["passed", ok === null ? "–" : ok ? "yes" : "no"]];
    for (const [name, value] of Object.entries(obj(d.reward_signals))) facts.push([`signal: ${name}`, typeof value === "object" && value !== null ? JSON.stringify(value) : num(value)]);
    facts.push(["finish", d.finish], ["tool calls", toolCallsOf(d) + (list(d.tools_used).length ? ` (${list(d.tools_used).join(", ")})` : "")], ["tool errors", num(d.tool_errors ?? 0)]);
    const shown = new Set(["reward_signals", "passed", "finish", "tool_calls", "tools_used", "tool_errors", "opd_turns", "correct"]);
    for (const [k, v] of Object.entries(d)) if (!shown.has(k)) facts.push([k, typeof v === "object" && v !== null ? JSON.stringify(v) : num(v)]);
    const scored = view.a.rows.length;
    $("rollout").innerHTML =
      `<h3>Rollout ${r}</h3><dl class="kv">${facts.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("")}</dl>` +
      drawTurnsTable(turns) +
      `<h3>Tokens (${view.n}${view.opd ? `; ${scored} with a teacher row` : ""})</h3><div class="legend">` +
      `<span class="sw prompt t">prompt (masked)</span><span class="sw inserted t">inserted, not sampled (masked)</span><span class="sw">generated</span>` +
      (view.opd ? `<span>scored turns: A = teacher − student logprob <span class="bar"></span> −3 … 0 … +3</span>` : "") + `</div>` +
      `<div class="tokens" id="tokens">${drawTokens(view, turns)}</div>` +
      (seq.messages ? `<h3>Conversation</h3>${drawMessages(seq.messages, turns)}` : '<p class="muted">No chat messages in this record: the tokens are the whole conversation.</p>');
    setHash(g, r);
    if (position !== undefined && position !== null) {
      const span = document.querySelector(`#tokens .t[data-p="${position}"]`);
      if (span) { span.scrollIntoView({ block: "center" }); pickToken(span); }
    } else $("rollout").scrollIntoView({ block: "start" });
  }

  // ---- the top-K popup ---------------------------------------------------------------------------
  function hidePopup() {
    $("popup").hidden = true;
    document.querySelectorAll("#tokens .picked").forEach((s) => s.classList.remove("picked"));
  }

  function pickToken(span) {
    const p = Number(span.dataset.p);
    const v = view;
    hidePopup();
    span.classList.add("picked");
    const id = v.a.tokens[p];
    const teacher = teacherAt(v, p);
    const student = v.student[p];
    const lines = [`<b>${esc(listText(piece(id)))}</b> · pos ${p} · id ${id} · ${v.kind[p] === 2 ? "inserted, not sampled" : KIND[v.kind[p]]}${v.kind[p] === 1 ? "" : " (masked)"}`];
    if (!Number.isNaN(student)) lines.push(`student logprob ${student.toFixed(3)}`);
    if (teacher !== null) lines.push(`teacher logprob ${teacher.toFixed(3)}` + (Number.isNaN(student) ? "" : ` · A = ${signed(teacher - student)}`));
    let table = v.opd ? '<p class="empty">No teacher row at this position.</p>' : "";
    const j = v.rowAt[p];
    if (j >= 0) {
      const rows = [];
      let sampledListed = false;
      for (let e = v.rowStart[j], rank = 1; e < v.rowStart[j + 1]; e++, rank++) {
        const alt = v.a.row_ids[e];
        const lp = v.a.row_logprobs[e] / v.scales.row_logprobs;
        sampledListed ||= alt === id;
        rows.push(`<tr${alt === id ? ' class="sampled"' : ""}><td class="num">${rank}</td><td class="tok">${esc(listText(piece(alt)))}</td>` +
          `<td class="num">${alt}</td><td class="num">${lp.toFixed(2)}</td><td class="num">${(100 * Math.exp(lp)).toFixed(1)}%</td></tr>`);
      }
      table = `<table class="topk"><thead><tr><th class="num">#</th><th>teacher's top-${rows.length}</th><th class="num">id</th><th class="num">logprob</th><th class="num">p</th></tr></thead>` +
        `<tbody>${rows.join("")}</tbody></table>` + (sampledListed ? "" : '<p class="muted">the sampled token is not in the teacher\'s top-K</p>');
    }
    const popup = $("popup");
    popup.innerHTML = `<button class="close" title="close (Esc)">×</button>${lines.map((l) => `<div>${l}</div>`).join("")}${table}`;
    popup.dataset.p = String(p);
    popup.hidden = false;
    // Beside the token (right of it, else left of it), so the text around it stays in view.
    const box = span.getBoundingClientRect();
    const width = popup.offsetWidth;
    const height = popup.offsetHeight;
    const left = box.right + 12 + width < innerWidth ? box.right + 12 : box.left - width - 12;
    popup.style.left = `${Math.max(4, left)}px`;
    popup.style.top = `${Math.max(4, Math.min(box.top - height / 3, innerHeight - height - 4))}px`;
    setHash(state.group, state.rollout, p);
  }

  // ---- wiring ---------------------------------------------------------------------------------
  function openFromHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    const g = h.has("g") ? Number(h.get("g")) : null;
    if (g === null || !summaryOf(g)) return;
    const r = h.has("r") ? Number(h.get("r")) : null;
    const p = h.has("p") ? Number(h.get("p")) : null;
    openGroup(g, (data) => { if (r !== null && data.sequences[r]) openRollout(data, r, p); });
  }

  $("index-head").addEventListener("click", (e) => {
    const th = e.target.closest("th[data-sort]");
    if (!th) return;
    state.desc = state.sort === th.dataset.sort ? !state.desc : false;
    state.sort = th.dataset.sort;
    relist();
    drawIndex();
  });
  $("index-rows").addEventListener("click", (e) => {
    const tr = e.target.closest("tr[data-g]");
    if (tr) openGroup(Number(tr.dataset.g));
  });
  for (const [id, key] of [["filter", "filter"], ["env", "env"]]) $(id).addEventListener("change", (e) => { state[key] = e.target.value; relist(); drawIndex(); });
  $("search").addEventListener("input", (e) => { state.search = e.target.value.trim().toLowerCase(); relist(); drawIndex(); });
  $("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); drawIndex(); });
  $("next").addEventListener("click", () => { state.page += 1; drawIndex(); });
  $("detail").addEventListener("click", (e) => {
    const span = e.target.closest("#tokens .t");
    if (span) { pickToken(span); return; }
    const turn = e.target.closest("[data-turn]");
    if (turn) $("turn-" + turn.dataset.turn)?.scrollIntoView({ block: "center" });
  });
  $("popup").addEventListener("click", (e) => { if (e.target.closest(".close")) hidePopup(); });
  // A link typed or pasted into this tab (the page's own address updates do not fire this).
  window.addEventListener("hashchange", openFromHash);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") hidePopup(); });

  if (!PAGE_OPD) {
    $("filter").querySelector('option[value="hints"]').remove();
    $("help").textContent = "a group, then a rollout; a token shows its ids and logprob; the address links to what is open";
  }
  const envs = [...new Set(ROWS.map((row) => row[COL.env]))].sort();
  $("env").innerHTML += envs.map((e) => `<option>${esc(e)}</option>`).join("");
  const rollouts = ROWS.reduce((n, row) => n + row[COL.rollouts], 0);
  const hints = ROWS.reduce((n, row) => n + row[COL.hinted_turns], 0);
  $("totals").textContent = `${ROWS.length} groups · ${rollouts} rollouts · ${envs.join(", ")}` + (PAGE_OPD ? ` · ${hints} hinted turns` : "");
  $("problems").textContent = SUMMARY.problems.length ? `${SUMMARY.problems.length} problem(s): ${SUMMARY.problems.slice(0, 3).join("; ")}` : "";
  drawIndex();
  // When the index is up (also while the group blobs further down are still being parsed).
  document.documentElement.dataset.indexMs = performance.now().toFixed(1);
  requestAnimationFrame(() => { document.documentElement.dataset.indexPaintMs = performance.now().toFixed(1); });
  openFromHash();
})();
