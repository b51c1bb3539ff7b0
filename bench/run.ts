/**
 * `npm run bench`: runs keyop's own benchmarks, prints a table and writes
 * bench/results/<date>-bench.json. `--quick` shortens every scenario.
 */
import { benchStorage } from "./storage.ts";
import { printTable, writeResults, type Row } from "./lib.ts";

const quick = process.argv.includes("--quick");
const rows: Row[] = [];
rows.push(...(await benchStorage({ quick })));
printTable(`keyop benchmarks${quick ? " (quick)" : ""}`, rows);
console.log(`\nresults: ${writeResults(quick ? "bench-quick" : "bench", rows)}`);
