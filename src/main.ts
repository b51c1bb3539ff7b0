/**
 * The `keyop` binary: one entry point for the agent and every client
 * command (README, "The command line"). Exit codes: 0 ok, 1 runtime failure, 2 usage error,
 * each failure with a one-line message on stderr.
 */
import { ApiError, UnreachableError } from "./client/local-client.ts";
import { ConfigError, KeyopError } from "./errors.ts";
import { UsageError } from "./cli/args.ts";
import { cmdRun } from "./cli/run.ts";
import { cmdPub } from "./cli/pub.ts";
import { cmdRequest } from "./cli/request.ts";
import { cmdSub } from "./cli/sub.ts";
import { cmdPull } from "./cli/pull.ts";
import { cmdChannels, cmdStatus, cmdVersion } from "./cli/info.ts";
import { cmdCert } from "./cli/cert.ts";
import { cmdPasswd } from "./cli/passwd.ts";
import { cmdExport } from "./cli/export.ts";
import { cmdImport } from "./cli/import.ts";
import { cmdReload } from "./cli/reload.ts";
import { tuneRuntime } from "./cli/runtime-options.ts";

const USAGE = `usage: keyop <command> [options]

  run        run the agent (data directory + local API socket)
  pub        publish a message
  request    send a request and print the reply
  sub        stream messages to stdout or into a command (--exec)
  pull       pull messages once
  export     write a channel's messages from the log files (agent running or not)
  import     store exported messages back (ids kept: duplicates dropped)
  channels   list channels and subscribers
  status     show the agent's status
  reload     make the agent read its configuration again (as SIGHUP does)
  cert       make and inspect federation certificates (ca, issue, inspect)
  passwd     hash a password (stdin) for mqtt.users
  version    print the version

"keyop <command> --help" describes each command.`;

const COMMANDS: Record<string, (argv: string[]) => Promise<number>> = {
  run: cmdRun,
  pub: cmdPub,
  request: cmdRequest,
  sub: cmdSub,
  pull: cmdPull,
  export: cmdExport,
  import: cmdImport,
  channels: cmdChannels,
  status: cmdStatus,
  reload: cmdReload,
  version: cmdVersion,
  cert: cmdCert,
  passwd: cmdPasswd,
};

/** Runs the command line `argv` (without the executable); resolves with the exit code. */
export async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  if (cmd === undefined || cmd === "help" || cmd === "--help" || cmd === "-h") {
    console.log(USAGE);
    return cmd === undefined ? 2 : 0;
  }
  if (cmd === "--version") return cmdVersion([]);
  const run = COMMANDS[cmd];
  if (!run) {
    process.stderr.write(`keyop: unknown command "${cmd}" (see keyop --help)\n`);
    return 2;
  }
  try {
    return await run(rest);
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`keyop ${cmd}: ${err.message} (see keyop ${cmd} --help)\n`);
      return 2;
    }
    if (err instanceof ConfigError) {
      process.stderr.write(`keyop ${cmd}: invalid configuration (${err.problems.length} problem${err.problems.length === 1 ? "" : "s"}):\n  ${err.problems.join("\n  ")}\n`);
      return 2;
    }
    if (err instanceof KeyopError && err.code === "invalid_config") {
      process.stderr.write(`keyop ${cmd}: ${err.message}\n`);
      return 2;
    }
    if (err instanceof ApiError || err instanceof UnreachableError || err instanceof KeyopError) {
      process.stderr.write(`keyop ${cmd}: ${err.message}\n`);
      return 1;
    }
    process.stderr.write(`keyop ${cmd}: ${err instanceof Error ? err.message : String(err)}\n`);
    return 1;
  }
}

if (import.meta.main) {
  // The agent first restarts itself with its allocator and JIT tuned (src/cli/runtime-options.ts).
  if (process.argv[2] === "run") tuneRuntime();
  // No top-level await: the compiled binary is built with --bytecode, which needs none.
  void main(process.argv.slice(2)).then((code) => process.exit(code));
}
