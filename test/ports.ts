/**
 * Free loopback ports for tests and benchmarks. A port is found by binding
 * port 0 and releasing it, so the kernel may hand the same port to the next
 * caller before the first one binds it for real (two servers of one test,
 * a NATS node and a hub, each picking its own). This module remembers what
 * it handed out in this process and never hands a port out twice.
 */
const handedOut = new Set<number>();

/** A loopback port that is free now and that no earlier call in this process returned. */
export function freePort(): number {
  for (let tries = 0; ; tries++) {
    const l = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
    const p = l.port;
    l.stop(true);
    if (!handedOut.has(p) || tries >= 100) {
      handedOut.add(p);
      return p;
    }
  }
}
