/**
 * A horizontal bar chart as a standalone SVG file: one per comparison
 * workload, so the figures can be read in docs/benchmarks.md without
 * running anything. No dependencies: plain SVG text.
 */

/** One bar: its label, value and (optional) colour key. */
export interface Bar {
  label: string;
  value: number;
  /** Bars with the same series share a colour (keyop, mosquitto, nats, floor). */
  series: string;
}

const COLOURS: Record<string, string> = { keyop: "#2b6cb0", mosquitto: "#c05621", nats: "#2f855a", floor: "#718096" };

const esc = (s: string) => s.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;");

/** Renders `bars` with a title and a unit; values are labelled at the bar ends. */
export function barChart(title: string, unit: string, bars: Bar[]): string {
  const labelW = 330;
  const barW = 380;
  const rowH = 26;
  const top = 44;
  const height = top + bars.length * rowH + 20;
  const max = Math.max(1e-9, ...bars.map((b) => (Number.isFinite(b.value) ? b.value : 0)));
  const rows = bars
    .map((b, i) => {
      const y = top + i * rowH;
      const v = Number.isFinite(b.value) ? b.value : 0;
      const w = Math.max(1, (v / max) * barW);
      const text = Number.isFinite(b.value) ? (Math.abs(b.value) >= 100 ? Math.round(b.value).toLocaleString("en-US") : b.value.toPrecision(3)) : "n/a";
      return (
        `<text x="${labelW - 8}" y="${y + 17}" text-anchor="end">${esc(b.label)}</text>` +
        `<rect x="${labelW}" y="${y + 4}" width="${w.toFixed(1)}" height="${rowH - 8}" fill="${COLOURS[b.series] ?? "#718096"}"/>` +
        `<text x="${labelW + w + 6}" y="${y + 17}">${esc(text)} ${esc(unit)}</text>`
      );
    })
    .join("\n");
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${labelW + barW + 150}" height="${height}" font-family="sans-serif" font-size="13">
<rect width="100%" height="100%" fill="white"/>
<text x="12" y="26" font-size="16" font-weight="bold">${esc(title)}</text>
${rows}
</svg>
`;
}
