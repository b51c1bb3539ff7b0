/** Where keyop keeps its data and socket when nothing says otherwise (shared by the CLI and the client library). */

/** Default data directory of `keyop run` without a config. */
export const DEFAULT_DATA_DIR = "./keyop-data";

/** File name of the API socket inside the data directory. */
export const SOCKET_NAME = "keyop.sock";
