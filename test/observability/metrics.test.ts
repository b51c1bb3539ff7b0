import { describe, expect, test } from "bun:test";
import { Histogram } from "../../src/observability/histogram.ts";
import { Exposition } from "../../src/observability/metrics.ts";

describe("Prometheus exposition", () => {
  test("families in order, labels escaped, histograms in seconds, empty extra families left out", () => {
    const h = new Histogram();
    for (const ms of [0.05, 0.3, 2, 7]) h.record(ms);
    const text = new Exposition()
      .counter("x_total", "Things.", [{ labels: { channel: 'a"b\\c\nd' }, value: 3 }, { value: 4 }])
      .gauge("y", "A gauge.", [])
      .histogram("z_seconds", "Latency.", h)
      .gauges({ up: { help: "Up.", value: 1 }, none: [], conns: [{ help: "Conns.", value: 2, labels: { kind: "mqtt" } }] })
      .text();
    const lines = text.split("\n");
    expect(lines.slice(0, 6)).toEqual(["# HELP x_total Things.", "# TYPE x_total counter", 'x_total{channel="a\\"b\\\\c\\nd"} 3', "x_total 4", "# HELP y A gauge.", "# TYPE y gauge"]);
    expect(lines).toContain('z_seconds_bucket{le="0.0001"} 1');
    expect(lines).toContain('z_seconds_bucket{le="0.0025"} 3');
    expect(lines).toContain('z_seconds_bucket{le="+Inf"} 4');
    expect(lines).toContain("z_seconds_count 4");
    expect(text).toContain('# TYPE up gauge\nup 1\n# HELP conns Conns.\n# TYPE conns gauge\nconns{kind="mqtt"} 2\n');
    expect(text).not.toContain("none");
    expect(text.endsWith("\n")).toBe(true);
  });
});
