// A small line chart on a canvas: series of [time ms, value] drawn over a
// fixed window ending now, with the largest value labelled.
"use strict";
const Chart = (() => {
  const COLOURS = ["#0b5cad", "#c2410c", "#1d6b2f", "#7e22ce", "#a4161a", "#0e7490", "#854d0e"];

  function draw(canvas, series, windowMs, unit) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 300, height = canvas.clientHeight || 160;
    canvas.width = width * ratio; canvas.height = height * ratio;
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, height);
    const left = 52, bottom = 18, top = 8, plotW = width - left - 6, plotH = height - top - bottom;
    const end = Date.now(), start = end - windowMs;
    let max = 0;
    for (const s of series) for (const [, v] of s.points) if (v > max) max = v;
    max = niceCeiling(max);
    ctx.strokeStyle = "#c9d0da"; ctx.fillStyle = "#4a5360"; ctx.font = "11px system-ui, sans-serif";
    ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = top + plotH - (plotH * i) / 4;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + plotW, y); ctx.stroke();
      ctx.fillText(format(max * i / 4) + unit, 2, y + 4);
    }
    const minutes = Math.round(windowMs / 60000);
    ctx.fillText("-" + minutes + " min", left, height - 4);
    ctx.fillText("now", left + plotW - 22, height - 4);
    series.forEach((s, i) => {
      ctx.strokeStyle = COLOURS[i % COLOURS.length]; ctx.lineWidth = 1.6;
      ctx.beginPath();
      let started = false;
      for (const [t, v] of s.points) {
        if (t < start) continue;
        const x = left + ((t - start) / windowMs) * plotW;
        const y = top + plotH - (max ? (v / max) * plotH : 0);
        if (started) ctx.lineTo(x, y); else { ctx.moveTo(x, y); started = true; }
      }
      ctx.stroke();
    });
  }

  function niceCeiling(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function format(v) {
    if (v >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
    return v >= 10 ? v.toFixed(0) : v.toFixed(1);
  }

  return { draw, format, COLOURS };
})();
