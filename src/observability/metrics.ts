/**
 * Prometheus text exposition (format 0.0.4): counter, gauge and histogram
 * families written in order. What the families are is decided by whoever
 * assembles them (the agent's `/metrics`); this file only knows the format.
 */
import type { Histogram } from "./histogram.ts";

/** One sample of a family. */
export interface Sample {
  value: number;
  labels?: Record<string, string>;
}

/** One gauge sample with its help text. */
export interface GaugeSample extends Sample {
  help: string;
}

/** Extra gauges supplied by the agent (connections, uptime, links ...): one sample or a labelled family. */
export type ExtraGauges = Record<string, GaugeSample | GaugeSample[]>;

/** Histogram bucket upper bounds in seconds. */
const BUCKETS_S = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

function esc(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

function labels(l: Record<string, string> | undefined): string {
  if (!l) return "";
  const parts = Object.entries(l).map(([k, v]) => `${k}="${esc(v)}"`);
  return parts.length ? `{${parts.join(",")}}` : "";
}

/** Families in the order they are added, as exposition text. */
export class Exposition {
  private readonly out: string[] = [];

  counter(name: string, help: string, samples: readonly Sample[]): this {
    return this.family("counter", name, help, samples);
  }

  gauge(name: string, help: string, samples: readonly Sample[]): this {
    return this.family("gauge", name, help, samples);
  }

  /** A latency histogram recorded in milliseconds, exposed in seconds. */
  histogram(name: string, help: string, h: Histogram): this {
    this.out.push(`# HELP ${name} ${help}`, `# TYPE ${name} histogram`);
    for (const b of h.cumulative(BUCKETS_S.map((s) => s * 1000))) this.out.push(`${name}_bucket{le="${b.le / 1000}"} ${b.count}`);
    this.out.push(`${name}_bucket{le="+Inf"} ${h.count}`, `${name}_sum ${h.total / 1000}`, `${name}_count ${h.count}`);
    return this;
  }

  /** Each extra gauge family (skipping empty ones). */
  gauges(extra: ExtraGauges): this {
    for (const [name, g] of Object.entries(extra)) {
      const samples = Array.isArray(g) ? g : [g];
      if (samples.length > 0) this.gauge(name, samples[0]!.help, samples);
    }
    return this;
  }

  text(): string {
    return this.out.join("\n") + "\n";
  }

  private family(type: "counter" | "gauge", name: string, help: string, samples: readonly Sample[]): this {
    this.out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    for (const s of samples) this.out.push(`${name}${labels(s.labels)} ${s.value}`);
    return this;
  }
}
