import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { durableStore, RELAY_MESSAGE } from "../../bench/relay-floor.ts";
import { type SteadyCost, steadyRows } from "../../bench/steady.ts";

const dir = mkdtempSync(join(tmpdir(), "keyop-steady-targets-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("the durable relay floor writes each read after the last, inside its preallocated file, and wraps", () => {
  const path = join(dir, "a.store");
  const store = durableStore(path);
  const size = statSync(path).size;
  expect(size).toBe(16 * 1024 * 1024);
  const read = (n: number, fill: number) => new Uint8Array(RELAY_MESSAGE * n).fill(fill);
  store(read(1, 1));
  store(read(3, 2));
  let file = readFileSync(path);
  expect(file[0]).toBe(1);
  expect(file[RELAY_MESSAGE - 1]).toBe(1);
  expect(file[RELAY_MESSAGE]).toBe(2);
  expect(file[4 * RELAY_MESSAGE - 1]).toBe(2);
  expect(file[4 * RELAY_MESSAGE]).toBe(0);
  // Three quarter-file reads fit after the first four messages; the fourth does not, so it goes to the start.
  const quarter = size / 4;
  for (let i = 0; i < 3; i++) store(read(quarter / RELAY_MESSAGE, 3 + i));
  store(read(quarter / RELAY_MESSAGE, 9));
  file = readFileSync(path);
  expect(statSync(path).size).toBe(size);
  expect(file[0]).toBe(9);
  expect(file[quarter - 1]).toBe(9);
  expect(file[quarter]).toBe(3); // the first quarter-read, from offset 4 messages: not overwritten past the wrapped one
  expect(file[3 * quarter + 4 * RELAY_MESSAGE - 1]).toBe(5);
  expect(file[size - 1]).toBe(0);
});

const cost = (system: SteadyCost["system"], workload: SteadyCost["workload"], rate: number, cpuUs: number, p99?: number): SteadyCost => ({
  system,
  workload,
  rate,
  cpuUs,
  wakeupsPerMsg: 1,
  byKindUs: {},
  byServerUs: [cpuUs],
  rssMB: [1],
  latency: p99 === undefined ? undefined : { p50: p99 / 4, p99, max: 2 * p99, lost: 0 },
});

test("the always target shows the durable floor's p99, and the low-rate targets the floors' and Mosquitto's own ratios", () => {
  const rows = steadyRows(
    [
      cost("keyop sync=always", "two hops", 1000, 400, 5.3),
      cost("bare Bun relay fdatasync", "two hops", 1000, 380, 1.92),
      cost("keyop sync=always", "two hops", 100, 1000, 3),
      cost("bare Bun relay fdatasync", "two hops", 100, 665, 2),
      cost("mosquitto", "two hops", 1000, 200, 1),
      cost("mosquitto", "two hops", 100, 400, 1),
      cost("keyop sync=none", "one broker", 1000, 40),
      cost("keyop sync=none", "one broker", 100, 120),
      cost("floor", "floor: writeSync", 1000, 30),
      cost("floor", "floor: writeSync", 100, 60),
    ],
    [],
  );
  const note = (metric: string) => rows.find((r) => r.metric === metric)?.note;
  expect(note("two hops @1000/s, keyop sync=always p99")).toBe("< 5: MISSED; the bare Bun relay with an fdatasync per read on each hop: 1.92 ms");
  expect(note("two hops, keyop sync=always: CPU per message @100/s over @1000/s")).toBe("<= 1.5: MISSED; the same ratio for the bare Bun relay 1.75x, mosquitto bridges 2.00x");
  expect(note("one broker, keyop sync=none: CPU per message @100/s over @1000/s")).toBe("<= 1.5: MISSED; the same ratio for the bare Bun floor 2.00x");
});
