/**
 * `npm run bench`: runs keyop's own benchmarks, prints a table and writes
 * bench/results/<date>-bench.json. `--quick` shortens every scenario.
 */
import { benchStorage } from "./storage.ts";
import { benchApi } from "./api.ts";
import { benchFederation } from "./federation.ts";
import { printTable, writeResults, type Row } from "./lib.ts";

const quick = process.argv.includes("--quick");
const rows: Row[] = [];
const only = process.argv.find((a) => a.startsWith("--only="))?.slice(7);
if (!only || only === "storage") rows.push(...(await benchStorage({ quick })));
if (!only || only === "api") rows.push(...(await benchApi({ quick })));
if (!only || only === "federation") rows.push(...(await benchFederation({ quick })));
printTable(`keyop benchmarks${quick ? " (quick)" : ""}`, rows);
console.log(`\nresults: ${writeResults(quick ? "bench-quick" : "bench", rows)}`);
